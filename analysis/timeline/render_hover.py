"""The hover labels of a timeline level: per category, invisible markers at the segments' middles that
carry each segment's name, where it ran and its times (render_figure.py draws the lines beside them)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.timeline.render_style import category_colour


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
    name = seg["name"].astype(str).str.slice(0, 80)
    merged = seg["count"] > 1
    name = name.where(~merged, seg["count"].astype(str) + " merged, first: " + name)
    where = seg["phase"].astype(str) + "; " + seg["stream"].astype(str) + pd.Series(_sizes(seg), index=seg.index)
    return name.to_numpy(), where.to_numpy()


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
