"""HTML pages that open offline: plotly.js either written once per folder and loaded by relative path,
or embedded in the page (self-contained); never a CDN or any other fetch.

A page is a title plus a list of blocks: plotly figures or ready HTML fragments (tables, links).
The pages open from a cluster's filesystem without internet.
"""

from __future__ import annotations

import html
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import plotly
import plotly.graph_objects as go
import plotly.io as pio
from plotly.offline import get_plotlyjs

from analysis.errors import TraceError

# Marks pages this project wrote: the report only overwrites HTML files that carry it.
GENERATOR = '<meta name="generator" content="ddp-overlap analysis">'
# The modebar's "download plot" works offline; the plotly logo link and MathJax would fetch.
PLOT_CONFIG = {"displaylogo": False, "scrollZoom": True, "responsive": True}
# The bundle's file name carries the plotly (Python) version, so two versions never share a name.
PLOTLY_FILE = f"plotly-{plotly.__version__}.min.js"

STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 1.2em 2em; color: #222; }
h1 { font-size: 1.5em; margin-bottom: 0.2em; } h2 { font-size: 1.2em; margin-top: 1.6em; }
p.note { color: #555; max-width: 70em; }
table.data { border-collapse: collapse; font-size: 0.92em; }
table.data th, table.data td { border-bottom: 1px solid #ddd; padding: 0.3em 0.8em; text-align: right; }
table.data th:first-child, table.data td:first-child { text-align: left; }
table.data th { background: #f4f4f4; }
span.swatch { display: inline-block; width: 0.8em; height: 0.8em; margin-right: 0.4em; vertical-align: -0.05em; }
"""


@dataclass(frozen=True)
class PlotlyJs:
    """Where a page gets plotly.js: embedded (self_contained) or from PLOTLY_FILE in `folder`."""

    self_contained: bool = False
    folder: Path | None = None  # None: the page's own folder


BESIDE_THE_PAGE = PlotlyJs()  # the default: plotly.js written once into the page's folder


@cache
def plotly_bundle() -> str:
    """The plotly.js source shipped with the installed plotly package (read once per process)."""
    return get_plotlyjs()


@cache
def plotly_bytes() -> bytes:
    """The plotly.js source as the bytes of PLOTLY_FILE (encoded once: a report checks the file before each
    page), from the package rather than plotly_bundle: pages that load the file never need the text, and
    the process holds one 4.8 MB copy of it, not two."""
    return get_plotlyjs().encode()


def figure_block(fig: go.Figure, div_id: str) -> str:
    """A figure as a div plus its newPlot call, relying on the page's single plotly.js copy."""
    return pio.to_html(
        fig,
        include_plotlyjs=False,
        full_html=False,
        div_id=div_id,
        config=PLOT_CONFIG,
        include_mathjax=False,
    )


def _script_tag(plotly_src: str | None) -> str:
    if plotly_src is None:
        return f'<script type="text/javascript">{plotly_bundle()}</script>'
    return f'<script type="text/javascript" src="{html.escape(plotly_src)}"></script>'


def page_html(title: str, blocks: list[str | go.Figure], intro: str = "", plotly_src: str | None = None) -> str:
    """Whole page: head with plotly.js (embedded when `plotly_src` is None, else loaded from that
    relative path), then each block in order."""
    return "".join(_page_pieces(title, blocks, intro, plotly_src))


def _page_pieces(title: str, blocks: list[str | go.Figure], intro: str, plotly_src: str | None) -> Iterator[str]:
    """page_html's text in pieces, each figure's made when its turn comes: a page is written piece by piece,
    never held whole (a side-by-side page's figure alone is megabytes, and one non-ASCII character
    makes Python hold every character of a string in two bytes or more)."""
    intro_html = f'<p class="note">{html.escape(intro)}</p>' if intro else ""
    yield (
        '<!DOCTYPE html>\n<html><head><meta charset="utf-8">'
        + GENERATOR
        + f"<title>{html.escape(title)}</title><style>{STYLE}</style>"
        + _script_tag(plotly_src)
        + f"</head><body><h1>{html.escape(title)}</h1>{intro_html}\n"
    )
    for i, block in enumerate(blocks):
        if i:
            yield "\n"
        yield figure_block(block, f"plot{i}") if isinstance(block, go.Figure) else block
    yield "\n</body></html>\n"


def notes_html(lines: Sequence[str]) -> str:
    """Lines shown under a chart or table, one paragraph each ('' for none)."""
    return "".join(f'<p class="note">{html.escape(line)}</p>' for line in lines)


def written_by_us(path: Path) -> bool:
    """Whether an existing HTML file is one of this project's pages (safe to overwrite)."""
    with open(path, encoding="utf-8", errors="replace") as f:
        return GENERATOR in f.read(4096)


def check_plotly_file(folder: Path) -> None:
    """Refuse a folder whose PLOTLY_FILE exists with other content (a file this tool did not write)."""
    target = Path(folder) / PLOTLY_FILE
    if not target.exists():
        return
    ours = plotly_bytes()
    if not target.is_file() or target.stat().st_size != len(ours) or target.read_bytes() != ours:
        raise TraceError(f"{target}: exists and is not this plotly.js bundle; refusing to overwrite it")


def write_plotly_file(folder: Path) -> Path:
    """PLOTLY_FILE in `folder`, written unless the same bundle is already there."""
    check_plotly_file(folder)
    target = Path(folder) / PLOTLY_FILE
    if not target.exists():
        folder.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(target.name + ".partial")
        partial.write_bytes(plotly_bytes())
        partial.replace(target)  # whole or not at all
    return target


def write_page(
    path: Path, title: str, blocks: list[str | go.Figure], intro: str = "", plotly_js: PlotlyJs = BESIDE_THE_PAGE
) -> Path:
    """Write the page (creating its folder) and, unless self-contained, the folder's plotly.js; returns
    the page's path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    src = None
    if not plotly_js.self_contained:
        bundle = write_plotly_file(plotly_js.folder or path.parent)
        src = Path(os.path.relpath(bundle, path.parent)).as_posix()
    partial = path.with_name(path.name + ".partial")
    try:
        with open(partial, "w", encoding="utf-8") as out:
            for piece in _page_pieces(title, blocks, intro, src):
                out.write(piece)
        partial.replace(path)  # whole or not at all
    finally:
        partial.unlink(missing_ok=True)  # a page that failed half-way leaves nothing behind
    return path
