"""Static images of figures (PNG, SVG) through kaleido driving the system Chromium, offline; and finding
that Chromium (`find_chromium`: the page checks under tests/support open pages in it too).

kaleido's page loads plotly.js from the installed plotly package and, unless told otherwise, MathJax
from a CDN; MathJax is switched off here, so an export makes no network request. All figures of one
command are drawn in one browser session (starting Chromium costs seconds; each figure then far less).
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import plotly.graph_objects as go

from analysis.errors import TraceError
from analysis.options import IMAGE_FORMATS

FORMATS = IMAGE_FORMATS  # --png / --svg (analysis/options.py)
DEFAULT_WIDTH_PX = 1400
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


@dataclass(frozen=True)
class Image:
    """One figure to write: `path` without suffix (the format adds it)."""

    fig: go.Figure
    path: Path
    width_px: int = DEFAULT_WIDTH_PX


def image_name(text: str) -> str:
    """A file-name stem from a title or label: lower case, runs of other characters as one '_'."""
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_") or "figure"


def find_chromium() -> str | None:
    """Path of a Chromium-family executable on PATH, or None."""
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


def check_export(formats: Sequence[str]) -> str:
    """The Chromium to draw with, or TraceError (one line) saying why images cannot be made here."""
    flags = "/".join(f"--{f}" for f in formats)
    try:
        import kaleido  # noqa: F401
    except ImportError:
        raise TraceError(f"{flags}: needs kaleido (pip install -e '.[png]')") from None
    chromium = find_chromium()
    if chromium is None:
        raise TraceError(f"{flags}: needs a system Chromium for kaleido (bash scripts/install_chromium.sh)")
    return chromium


def refuse_existing(images: Sequence[Image], formats: Sequence[str], ours: bool) -> None:
    """Refuse to overwrite image files unless `ours` (the folder holds pages this tool wrote)."""
    if ours:
        return
    for image in images:
        for fmt in formats:
            target = image.path.with_suffix("." + fmt)
            if target.exists():
                raise TraceError(f"{target}: exists and was not written by this tool; refusing to overwrite it")


def write_images(images: Sequence[Image], formats: Sequence[str], chromium: str) -> list[Path]:
    """Each figure in each format, in one kaleido session; returns the files written. A failure is one
    TraceError line naming the first figure that failed."""
    import kaleido

    specs = []
    for image in images:
        height = int(image.fig.layout.height or 500)
        image.path.parent.mkdir(parents=True, exist_ok=True)
        for fmt in formats:
            target = image.path.with_suffix("." + fmt)
            specs.append(
                {
                    "fig": image.fig,
                    "path": str(target),
                    "opts": {"format": fmt, "width": image.width_px, "height": height},
                }
            )
    try:
        errors = kaleido.write_fig_from_object_sync(specs, kopts={"mathjax": False, "path": chromium})
    except Exception as e:  # kaleido and Chromium fail in many types; none is worth a traceback
        raise TraceError(f"image export failed: {type(e).__name__}: {_first_line(e)}") from None
    if errors:
        raise TraceError(f"image export failed: {type(errors[0]).__name__}: {_first_line(errors[0])}")
    written = [Path(s["path"]) for s in specs]
    missing = [p for p in written if not p.is_file()]
    if missing:
        raise TraceError(f"image export failed: kaleido wrote no {missing[0]}")
    return written


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [""])[0]
