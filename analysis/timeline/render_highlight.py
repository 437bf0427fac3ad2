"""A timeline panel's highlight spans (each step's backward pass) as outlined bands behind one rank's lanes."""

from __future__ import annotations

from typing import TYPE_CHECKING

from analysis.render.palette import BACKWARD_SPAN, PHASE_COLOURS
from contract import BACKWARD

if TYPE_CHECKING:
    from analysis.timeline.panel import Panel

MAX_BANDS = 400  # more highlight bands than this (a long run's steps x ranks) are not drawn at all
BAND_COLOUR = PHASE_COLOURS[BACKWARD]


def highlight_bands(panel: Panel, axes: tuple[str, str], in_legend: set[str]) -> list[dict]:
    """Each highlight span as a band (a layout shape on the panel's `axes`, 'x2', 'y2') behind its rank's
    lanes, outlined so it shows where lanes cover it; one legend entry for all panels."""
    lo, hi = (panel.overview or panel).window_ns  # what the panel can show: its step, or its whole run
    spans = panel.highlight.assign(
        start=panel.highlight["start"].clip(lower=lo), end=panel.highlight["end"].clip(upper=hi)
    )
    lanes = panel.lanes.groupby("rank")["lane"].agg(["min", "max"])
    spans = spans.loc[spans["rank"].isin(lanes.index) & (spans["end"] > spans["start"])]
    if spans.empty or len(spans) > MAX_BANDS:
        return []
    top = lanes.loc[spans["rank"], "min"].to_numpy() - 0.5
    bottom = lanes.loc[spans["rank"], "max"].to_numpy() + 0.5
    x0 = (spans["start"].to_numpy(dtype=float) - panel.origin_ns) / 1e6
    x1 = (spans["end"].to_numpy(dtype=float) - panel.origin_ns) / 1e6
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
            fillcolor=BACKWARD_SPAN,
            line=dict(color=BAND_COLOUR, width=1.5),
            layer="below",
            name=panel.highlight_name,
            legendgroup="highlight",
            showlegend=first and i == 0,
            legendrank=-1,
        )
        for i, (a, b, t, u) in enumerate(zip(x0, x1, top, bottom, strict=True))
    ]
