"""Self-contained HTML pages: plotly.js embedded once per file, no CDN, no network fetch.

A page is a title plus a list of blocks: plotly figures or ready HTML fragments (tables, links).
The files open from a cluster's filesystem without internet.
"""

from __future__ import annotations

import html
from pathlib import Path

import plotly.graph_objects as go
import plotly.io as pio
from plotly.offline import get_plotlyjs

# Marks pages this project wrote: the report only overwrites HTML files that carry it.
GENERATOR = '<meta name="generator" content="ddp-overlap analysis">'
# The modebar's "download plot" works offline; the plotly logo link and MathJax would fetch.
PLOT_CONFIG = {"displaylogo": False, "scrollZoom": True, "responsive": True}

STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 1.2em 2em; color: #222; }
h1 { font-size: 1.5em; margin-bottom: 0.2em; } h2 { font-size: 1.2em; margin-top: 1.6em; }
p.note { color: #555; max-width: 70em; }
table.data { border-collapse: collapse; font-size: 0.92em; }
table.data th, table.data td { border-bottom: 1px solid #ddd; padding: 0.3em 0.8em; text-align: right; }
table.data th:first-child, table.data td:first-child { text-align: left; }
table.data th { background: #f4f4f4; }
"""


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


def page_html(title: str, blocks: list[str | go.Figure], intro: str = "") -> str:
    """Whole page: head with the embedded plotly.js, then each block in order."""
    parts = []
    for i, block in enumerate(blocks):
        parts.append(figure_block(block, f"plot{i}") if isinstance(block, go.Figure) else block)
    intro_html = f'<p class="note">{html.escape(intro)}</p>' if intro else ""
    return (
        '<!DOCTYPE html>\n<html><head><meta charset="utf-8">'
        + GENERATOR
        + f"<title>{html.escape(title)}</title><style>{STYLE}</style>"
        f'<script type="text/javascript">{get_plotlyjs()}</script></head>'
        f"<body><h1>{html.escape(title)}</h1>{intro_html}\n" + "\n".join(parts) + "\n</body></html>\n"
    )


def written_by_us(path: Path) -> bool:
    """Whether an existing HTML file is one of this project's pages (safe to overwrite)."""
    with open(path, encoding="utf-8", errors="replace") as f:
        return GENERATOR in f.read(4096)


def write_page(path: Path, title: str, blocks: list[str | go.Figure], intro: str = "") -> Path:
    """Write the page (creating its folder) and return its path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page_html(title, blocks, intro), encoding="utf-8")
    return path
