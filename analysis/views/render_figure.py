"""Turn timeline panels (generic segment frames) into one plotly figure of stacked panels.

Every lane is a row of thick WebGL (scattergl) line segments, one trace per category so colours
and legend entries are shared by all panels; an invisible marker at each segment's middle carries
the hover text. Periods where communication overlaps compute are shaded per rank, behind the
rank's lanes. All panels share the x axis: milliseconds since each panel's own origin.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from analysis.measures import intervals
from analysis.views.render_binning import check_segments, merge_subpixel
from analysis.views.render_style import (
    CATEGORY_LABELS,
    OVERLAP_COLOUR,
    OVERLAP_LINE,
    category_colour,
    category_order,
)

LANE_PX = 22  # height of one lane in the page
PANEL_GAP_PX = 80  # room between panels for the panel title
OVERLAP_NAME = "comm overlaps compute"


@dataclass(frozen=True)
class Panel:
    """One trace's picture: segments on lanes, overlap periods, and the time origin (all ns)."""

    title: str
    segments: pd.DataFrame  # render_binning.SEGMENT_COLUMNS, optionally count/busy
    lanes: pd.DataFrame  # lane (0..n-1, top to bottom), label, rank
    origin_ns: int
    window_ns: tuple[int, int]
    overlap: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=["rank", "start", "end"]))
    merged_pixel_ns: float | None = None  # the resolution the segments were already merged at, if any

    def __post_init__(self) -> None:
        check_segments(self.segments)
        for col in ("lane", "label", "rank"):
            if col not in self.lanes.columns:
                raise ValueError(f"panel {self.title!r}: lanes frame lacks column {col!r}")
        if not self.window_ns[1] > self.window_ns[0]:
            raise ValueError(f"panel {self.title!r}: empty window {self.window_ns!r}")


def panel_pixel_ns(panel: Panel, width_px: int) -> float:
    """Nanoseconds covered by one pixel when the panel's whole window spans `width_px`."""
    return (panel.window_ns[1] - panel.window_ns[0]) / width_px


def _line_xy(seg: pd.DataFrame, origin_ns: int) -> tuple[np.ndarray, np.ndarray]:
    """Flattened [start, end, NaN] x values (ms) and [lane, lane, NaN] y values for scattergl lines."""
    n = len(seg)
    x = np.full((n, 3), np.nan)
    x[:, 0] = (seg["start"].to_numpy() - origin_ns) / 1e6
    x[:, 1] = (seg["end"].to_numpy() - origin_ns) / 1e6
    y = np.full((n, 3), np.nan, dtype=np.float32)  # lane numbers are exact in float32: half the bytes
    y[:, 0] = y[:, 1] = seg["lane"].to_numpy(dtype=np.float32)
    return x.ravel(), y.ravel()


def _hover_text(seg: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Per segment: its name (with the count when merged) and 'phase: P, stream: S'.

    Plain text only: the HTML tags live once in the hovertemplate, since JSON escapes every '<'
    in per-point strings into six bytes.
    """
    name = seg["name"].astype(str).str.slice(0, 80)
    merged = seg["count"] > 1
    name = name.where(~merged, seg["count"].astype(str) + " merged, first: " + name)
    where = "phase: " + seg["phase"].astype(str) + ", " + seg["stream"].astype(str)
    return name.to_numpy(), where.to_numpy()


def _hover_trace(seg: pd.DataFrame, origin_ns: int, category: str) -> go.Scattergl:
    """Invisible markers at segment middles that carry the hover label of each segment.

    One per category, so the colour is a scalar: per-point colour arrays cost plotly a Python-level
    validation per point.
    """
    start_ms = (seg["start"].to_numpy() - origin_ns) / 1e6
    dur_ms = (seg["end"] - seg["start"]).to_numpy() / 1e6
    custom = np.column_stack([start_ms, dur_ms, seg["count"].to_numpy(), seg["busy"].to_numpy() / 1e6])
    names, where = _hover_text(seg)
    return go.Scattergl(
        x=start_ms + dur_ms / 2,
        y=seg["lane"].to_numpy(dtype=np.float32),
        mode="markers",
        marker=dict(size=8, opacity=0, color=category_colour(category)),
        text=names,
        hovertext=where,
        customdata=custom.astype(np.float32),
        hovertemplate=(
            "<b>%{text}</b><br>%{hovertext}<br>start: %{customdata[0]:.3f} ms<br>duration: %{customdata[1]:.3f} ms"
            "<br>count: %{customdata[2]}, busy %{customdata[3]:.3f} ms<extra></extra>"
        ),
        showlegend=False,
        legendgroup=category,
        name="hover",
    )


def _overlap_trace(panel: Panel, pixel_ns: float, shown: bool) -> go.Scatter | None:
    """Filled rectangles over each rank's lanes where its communication overlaps compute."""
    if panel.overlap.empty:
        return None
    span = panel.lanes.groupby("rank")["lane"].agg(["min", "max"])
    xs, ys = [], []
    for rank, rows in panel.overlap.groupby("rank"):  # one iteration per rank, not per event
        if rank not in span.index:
            continue
        s, e = intervals.union(rows["start"].to_numpy(), rows["end"].to_numpy(), gap=pixel_ns)
        s, e = (s - panel.origin_ns) / 1e6, (e - panel.origin_ns) / 1e6
        top, bottom = span.loc[rank, "min"] - 0.5, span.loc[rank, "max"] + 0.5
        x = np.column_stack([s, e, e, s, s, np.full_like(s, np.nan)]).ravel()
        y = np.tile([top, top, bottom, bottom, top, np.nan], s.size)
        xs.append(x)
        ys.append(y)
    if not xs:
        return None
    return go.Scatter(
        x=np.concatenate(xs),
        y=np.concatenate(ys),
        mode="lines",
        fill="toself",
        fillcolor=OVERLAP_COLOUR,
        line=dict(width=0.5, color=OVERLAP_LINE),
        hoverinfo="skip",
        name=OVERLAP_NAME,
        legendgroup="overlap",
        showlegend=shown,
    )


def _rank_bands(fig: go.Figure, panel: Panel, row: int) -> None:
    """A faint band behind every other rank's lanes, so the eye keeps ranks apart (one shape per rank)."""
    span = panel.lanes.groupby("rank")["lane"].agg(["min", "max"])
    for i, (top, bottom) in enumerate(zip(span["min"], span["max"], strict=True)):
        if i % 2:
            fig.add_hrect(
                y0=top - 0.5, y1=bottom + 0.5, row=row, col=1, fillcolor="#f3f3f3", line_width=0, layer="below"
            )


def build_figure(
    panels: list[Panel], width_px: int = 1600, x_title: str = "time since the chosen step's start (ms)"
) -> go.Figure:
    """Stacked panels sharing one time axis; sub-pixel work merged at full-view resolution."""
    if not panels:
        raise ValueError("build_figure needs at least one panel")
    heights = [max(len(p.lanes), 1) * LANE_PX + PANEL_GAP_PX for p in panels]
    total = sum(heights) + 60
    fig = make_subplots(
        rows=len(panels),
        cols=1,
        shared_xaxes=True,
        row_heights=heights,
        vertical_spacing=PANEL_GAP_PX / total * 0.8 if len(panels) > 1 else 0.0,
        subplot_titles=[p.title for p in panels],
    )
    in_legend: set[str] = set()
    line_width = LANE_PX * 0.62
    for row, panel in enumerate(panels, start=1):
        pixel_ns = panel_pixel_ns(panel, width_px)
        seg = panel.segments if panel.merged_pixel_ns == pixel_ns else merge_subpixel(panel.segments, pixel_ns)
        shading = _overlap_trace(panel, pixel_ns, shown="overlap" not in in_legend)
        if shading is not None:
            in_legend.add("overlap")
            fig.add_trace(shading, row=row, col=1)
        for category in category_order(seg["category"].unique()):
            part = seg.loc[seg["category"] == category]
            x, y = _line_xy(part, panel.origin_ns)
            fig.add_trace(
                go.Scattergl(
                    x=x,
                    y=y,
                    mode="lines",
                    line=dict(width=line_width, color=category_colour(category)),
                    hoverinfo="skip",
                    name=CATEGORY_LABELS.get(category, category),
                    legendgroup=category,
                    showlegend=category not in in_legend,
                ),
                row=row,
                col=1,
            )
            in_legend.add(category)
            fig.add_trace(_hover_trace(part, panel.origin_ns, category), row=row, col=1)
        _rank_bands(fig, panel, row)
        n_lanes = max(len(panel.lanes), 1)
        fig.update_yaxes(
            row=row,
            col=1,
            tickmode="array",
            tickvals=panel.lanes["lane"].tolist(),
            ticktext=panel.lanes["label"].tolist(),
            range=[n_lanes - 0.5, -0.5],
            fixedrange=True,
            showgrid=False,
            zeroline=False,
            tickfont=dict(size=10),
        )
    # Start on the chosen window, not on the neighbouring steps' ranges that reach into it.
    lo = min((p.window_ns[0] - p.origin_ns) / 1e6 for p in panels)
    hi = max((p.window_ns[1] - p.origin_ns) / 1e6 for p in panels)
    fig.update_xaxes(showgrid=True, gridcolor="#eeeeee", zeroline=False, range=[lo, hi])
    fig.update_xaxes(title_text=x_title, row=len(panels), col=1)
    fig.update_layout(
        height=total,
        template="plotly_white",
        hovermode="closest",
        margin=dict(l=170, r=30, t=90, b=60),
        legend=dict(orientation="h", yanchor="bottom", y=1.0 + 40 / total, x=0, font=dict(size=11)),
    )
    return fig


def count_drawn_segments(fig: go.Figure) -> int:
    """Number of line segments a figure draws (every third x value is a segment's start)."""
    return sum(len(t.x) // 3 for t in fig.data if isinstance(t, go.Scattergl) and t.mode == "lines")
