"""Plotly figures assembled from plain dicts and handed to plotly once, without its per-property checks.

Plotly validates every property on every add_trace, add_shape and update call, re-validating what the
figure already holds, and deep-copies its template each time a figure names one: for a report's
eighteen figures that cost more than computing what they show. The figures here are built as the
dicts plotly would produce (make_subplots still lays out the grid) and wrapped once, unchecked; the
template is plotly's registered object, shared, never modified. That the dicts are what plotly's
checks accept, unchanged, is a test (tests/analysis/render/test_figure_dicts.py validates every figure
a report draws and compares it with the unchecked one).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import plotly.graph_objects as go
import plotly.io as pio
from plotly.basedatatypes import BaseTraceType

TEMPLATE = "plotly_white"


def top_left_title(text: str) -> dict[str, Any]:
    """A figure title at the top left of the page, above the legend and the plots (padded 12 px)."""
    return {"text": text, "x": 0, "xanchor": "left", "y": 1, "yref": "container", "yanchor": "top", "pad": {"t": 12}}


def template() -> go.layout.Template:
    """Plotly's registered TEMPLATE, the object itself (shared: not to be modified)."""
    return pio.templates[TEMPLATE]


def trusted_figure(data: Sequence[dict | BaseTraceType] = (), layout: dict[str, Any] | None = None) -> go.Figure:
    """A figure of traces (dicts, each with its 'type', or trace objects) and a layout dict, not validated
    by plotly; the layout gets TEMPLATE unless it names one. Later updates of the figure (add_trace,
    update_layout, add_vline, ...) are not validated either: the figure's tests validate them."""
    layout = {"template": template(), **(layout or {})}
    return go.Figure(data=list(data), layout=layout, _validate=False)


def ordered_figure(data: Sequence[dict], layout: dict[str, Any]) -> go.Figure:
    """A trusted_figure whose layout keeps the order of `layout`'s keys (the constructor would put them in
    plotly's order; a page writes them as the figure holds them)."""
    fig = trusted_figure(data)
    fig.update_layout(layout)
    return fig


def _clamped(y: float) -> float:
    """A domain end a float error put just outside [0, 1], put back (as make_subplots does)."""
    return 0.0 if -0.01 < y < 0.0 else 1.0 if 1.0 < y < 1.01 else y


def stacked_layout(titles: Sequence[str], heights: Sequence[float], spacing: float) -> dict[str, Any]:
    """The layout plotly's make_subplots(rows=len(titles), cols=1, shared_xaxes=True, row_heights=heights,
    vertical_spacing=spacing, subplot_titles=titles) lays out, computed the way it computes it but
    without building and validating a figure (a test compares the two): per row, top to bottom, an x
    axis (all matching the bottom one, whose tick labels alone show) and a y axis on its share of the
    height, and each non-empty title centred above its row."""
    rows = len(titles)
    if len(heights) != rows:
        raise ValueError(f"{rows} titles but {len(heights)} heights")
    total = float(sum(heights))
    shares = [(1.0 - spacing * (rows - 1)) * (h / total) for h in reversed(heights)]  # bottom row first
    layout: dict[str, Any] = {}
    annotations = []
    for r, title in enumerate(titles):  # r = 0: the top row
        up = rows - 1 - r  # rows below this one
        bottom = sum(shares[:up]) + up * spacing
        domain = [_clamped(bottom), _clamped(bottom + shares[-1 - r])]
        x, y = ("x", "y") if r == 0 else (f"x{r + 1}", f"y{r + 1}")
        layout[f"xaxis{'' if r == 0 else r + 1}"] = {"anchor": y, "domain": [0.0, 1.0]}
        layout[f"yaxis{'' if r == 0 else r + 1}"] = {"anchor": x, "domain": domain}
        if r < rows - 1:
            layout[f"xaxis{'' if r == 0 else r + 1}"].update(matches=f"x{rows}", showticklabels=False)
        if title:
            annotations.append(
                {
                    "font": {"size": 16},
                    "showarrow": False,
                    "text": title,
                    "x": 0.5,
                    "xanchor": "center",
                    "xref": "paper",
                    "y": domain[1],
                    "yanchor": "bottom",
                    "yref": "paper",
                }
            )
    if annotations:
        layout["annotations"] = annotations
    return layout
