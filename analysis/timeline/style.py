"""How a timeline marks its segments: each category's colour (from palette.py) and legend label, shared by
every panel and page; the hover labels beside the segments; the highlighted spans' bands.

A colour belongs to a category, never to a trace or a panel. Compute (GPU kernels and the CPU's
phase ranges) is coloured by its phase, so backward work is orange on every lane; communication
(GPU kernels and CPU comm ranges) by its collective; the overlap strip by hidden or exposed.

The hover labels of a level are, per category, invisible markers at the segments' middles that carry
each segment's name, where it ran and its times (figure.py draws the lines beside them). A
panel's highlight spans (each step's backward pass) are outlined bands behind one rank's lanes.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from analysis.render import palette
from contract import BACKWARD, FORWARD, GRAD_SYNC, OPTIMIZER

if TYPE_CHECKING:
    from analysis.timeline.panel import Panel

PHASE_CATEGORIES = (FORWARD, BACKWARD, OPTIMIZER, GRAD_SYNC)
COMM_CATEGORIES = tuple(f"comm:{c}" for c in palette.COLLECTIVE_COLOURS)
HIDDEN, EXPOSED = "hidden", "exposed"
MAX_BANDS = 400  # more highlight bands than this (a long run's steps x ranks) are not drawn at all
BAND_COLOUR = palette.PHASE_COLOURS[BACKWARD]

# Draw order and legend order are list order.
CATEGORY_COLOURS: dict[str, str] = {
    "step": palette.STEP,  # CPU: the step range
    **{p: palette.PHASE_COLOURS[p] for p in PHASE_CATEGORIES},  # CPU phases; GPU compute launched in them
    "compute": palette.PHASE_COLOURS["other"],  # GPU compute launched outside the phases
    "memory": palette.MEMORY,  # GPU: memcpy / memset
    **{f"comm:{c}": colour for c, colour in palette.COLLECTIVE_COLOURS.items()},  # CPU comm ranges, GPU comm
    "nvtx": palette.OTHER_NVTX,  # CPU: any other NVTX range (framework ops, library ranges)
    HIDDEN: palette.HIDDEN_COMM,  # overlap strip: communication with compute under it
    EXPOSED: palette.EXPOSED_COMM,  # overlap strip: communication with no compute under it
}

CATEGORY_LABELS: dict[str, str] = {
    "step": "step",
    FORWARD: FORWARD,
    BACKWARD: BACKWARD,
    OPTIMIZER: OPTIMIZER,
    GRAD_SYNC: f"{GRAD_SYNC} (CPU wait)",
    "compute": "compute outside the phases",
    "memory": "memcpy/memset",
    **{f"comm:{c}": label for c, label in palette.COLLECTIVE_LABELS.items()},
    "nvtx": "other NVTX range",
    HIDDEN: "comm hidden under compute",
    EXPOSED: "comm exposed",
}


def comm_category(name: str) -> str:
    """The comm category of a collective's op, range or kernel name (comm:all_reduce, ...)."""
    return f"comm:{palette.collective_of(name)}"


def category_colour(category: str) -> str:
    """Colour of a category; unknown categories fall back to the 'other NVTX' grey."""
    return CATEGORY_COLOURS.get(category, CATEGORY_COLOURS["nvtx"])


def category_order(categories: Collection[str]) -> list[str]:
    """Categories sorted into draw order (known ones first, in the table's order)."""
    known = [c for c in CATEGORY_COLOURS if c in set(categories)]
    return known + sorted(set(categories) - set(known))


# The hover labels


def category_rows(seg: pd.DataFrame) -> dict[str, np.ndarray]:
    """The positions of each category's segments, in their order."""
    category = seg["category"]
    if not isinstance(category.dtype, pd.CategoricalDtype):
        return seg.groupby(category.astype(str), sort=False).indices
    names = category.cat.categories.astype(str)  # group the integer codes, not a string per segment
    by_code = pd.Series(category.cat.codes.to_numpy()).groupby(category.cat.codes.to_numpy(), sort=False).indices
    return {names[code]: rows for code, rows in by_code.items()}


def _size(b: float) -> str:
    return f" · {b / 1e6:.2f} MB" if b >= 1e5 else f" · {b / 1e3:.1f} kB"


def _sizes(seg: pd.DataFrame) -> np.ndarray:
    """' · <bytes>' of each segment that carries a byte count (NVTX comm ranges), '' elsewhere."""
    out = np.full(len(seg), "", dtype=object)
    if "bytes" in seg:
        b = seg["bytes"].to_numpy(dtype=float)
        known = np.flatnonzero(~np.isnan(b))  # formatted one by one, but only the few that have bytes
        out[known] = [_size(x) for x in b[known]]
    return out


def _hover_text(seg: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Per segment: its name (with the count when merged) and 'step N · phase<br>stream S · bytes'.

    The HTML tags live once in the hovertemplate where they can, since JSON escapes every '<' in
    per-point strings into six bytes.
    """
    name = seg["name"].astype(str).str.slice(0, 80).to_numpy(dtype=object)
    count = seg["count"].to_numpy()
    merged = np.flatnonzero(count > 1)  # one per drawn block at most: a few thousand strings
    name[merged] = [f"{n} merged, first: {text}" for n, text in zip(count[merged], name[merged], strict=True)]
    # phase and stream are strings already (lane_segments.phase_labels, streams_of): joined as Python strings,
    # element by element in numpy, rather than converted into and out of pandas' string arrays
    phase, stream = (seg[c].to_numpy(dtype=object) for c in ("phase", "stream"))
    return name, phase + "; " + stream + _sizes(seg)


def hover_traces(hover: pd.DataFrame, origin_ns: int, visible: bool) -> dict[str, dict]:
    """Per category, invisible markers at segment middles that carry the hover label of each segment
    (a scattergl trace as a dict: plotly validates it once, when the figure takes it). The labels are
    built for the whole level at once, then split.

    One trace per category, so the colour is a scalar: per-point colour arrays cost plotly a
    Python-level validation per point.
    """
    start, end = hover["start"].to_numpy(), hover["end"].to_numpy()
    start_ms, dur_ms = (start - origin_ns) / 1e6, (end - start) / 1e6
    custom = np.column_stack([start_ms, dur_ms, hover["count"].to_numpy(), hover["busy"].to_numpy() / 1e6])
    custom = custom.astype(np.float32)
    middle = (start_ms + dur_ms / 2).astype(np.float32)
    lane = hover["lane"].to_numpy(dtype=np.float32)
    names, where = _hover_text(hover)
    return {
        category: dict(
            type="scattergl",
            x=middle[rows],
            y=lane[rows],
            mode="markers",
            marker=dict(size=8, opacity=0, color=category_colour(category)),
            text=names[rows].astype(str),  # fixed-width strings: plotly deep-copies an object array item by item
            hovertext=where[rows].astype(str),
            customdata=custom[rows],
            hovertemplate=(
                "<b>%{text}</b><br>%{hovertext}<br>start: %{customdata[0]:.3f} ms<br>duration: %{customdata[1]:.3f} ms"
                "<br>count: %{customdata[2]}, busy %{customdata[3]:.3f} ms<extra></extra>"
            ),
            showlegend=False,
            legendgroup=category,
            name="hover",
            visible=visible,
        )
        for category, rows in category_rows(hover).items()
    }


# The highlight bands


def _rank_lanes(lanes: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rank, its first lane, its last lane) of every rank among the lanes, by rank."""
    rank, lane = lanes["rank"].to_numpy(), lanes["lane"].to_numpy()
    order = np.argsort(rank, kind="stable")
    ranks, at = np.unique(rank[order], return_index=True)
    if not ranks.size:
        return ranks, lane[:0], lane[:0]
    return ranks, np.minimum.reduceat(lane[order], at), np.maximum.reduceat(lane[order], at)


def highlight_bands(panel: Panel, axes: tuple[str, str], in_legend: set[str]) -> list[dict]:
    """Each highlight span as a band (a layout shape on the panel's `axes`, 'x2', 'y2') behind its rank's
    lanes, outlined so it shows where lanes cover it; one legend entry for all panels."""
    lo, hi = (panel.overview or panel).window_ns  # what the panel can show: its step, or its whole run
    if panel.highlight.empty:
        return []
    rank = panel.highlight["rank"].to_numpy()
    start = np.maximum(panel.highlight["start"].to_numpy(), lo)
    end = np.minimum(panel.highlight["end"].to_numpy(), hi)
    ranks, first_lane, last_lane = _rank_lanes(panel.lanes)
    at = np.minimum(np.searchsorted(ranks, rank), max(len(ranks) - 1, 0))
    kept = np.flatnonzero((ranks[at] == rank) & (end > start)) if len(ranks) else np.empty(0, np.int64)
    if not kept.size or kept.size > MAX_BANDS:
        return []
    top, bottom = first_lane[at[kept]] - 0.5, last_lane[at[kept]] + 0.5
    x0 = (start[kept].astype(float) - panel.origin_ns) / 1e6
    x1 = (end[kept].astype(float) - panel.origin_ns) / 1e6
    key = "highlight: " + panel.highlight_name  # apart from the category of the same name
    first = key not in in_legend
    in_legend.add(key)
    xref, yref = axes
    return [
        dict(
            type="rect",
            xref=xref,
            yref=yref,
            x0=a,
            x1=b,
            y0=t,
            y1=u,
            fillcolor=palette.BACKWARD_SPAN,
            line=dict(color=BAND_COLOUR, width=1.5),
            layer="below",
            name=panel.highlight_name,
            legendgroup="highlight",
            showlegend=first and i == 0,
            legendrank=-1,
        )
        for i, (a, b, t, u) in enumerate(zip(x0, x1, top, bottom, strict=True))
    ]
