"""Plotly figures assembled from plain dicts and handed to plotly once, without its per-property checks.

Plotly validates every property on every add_trace, add_shape and update call, re-validating what the
figure already holds, and deep-copies its template each time a figure names one: for a report's
eighteen figures that cost more than computing what they show. The figures here are built as the
dicts plotly would produce (make_subplots still lays out the grid) and wrapped once, unchecked; the
template is plotly's registered object, shared, never modified. That the dicts are what plotly's
checks accept, unchanged, is a test (tests/analysis/views/test_figure_dicts.py validates every figure
a report draws and compares it with the unchecked one).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import plotly.graph_objects as go
import plotly.io as pio
from plotly.basedatatypes import BaseTraceType
from plotly.subplots import make_subplots

TEMPLATE = "plotly_white"


def template() -> go.layout.Template:
    """Plotly's registered TEMPLATE, the object itself (shared: not to be modified)."""
    return pio.templates[TEMPLATE]


def trusted_figure(data: Sequence[dict | BaseTraceType] = (), layout: dict[str, Any] | None = None) -> go.Figure:
    """A figure of traces (dicts, each with its 'type', or trace objects) and a layout dict, not validated
    by plotly; the layout gets TEMPLATE unless it names one. Later updates of the figure (add_trace,
    update_layout, add_vline, ...) are not validated either: the figure's tests validate them."""
    layout = {"template": template(), **(layout or {})}
    return go.Figure(data=list(data), layout=layout, _validate=False)


def subplot_layout(**grid: Any) -> dict[str, Any]:
    """The layout make_subplots(**grid) lays out (axes and their domains, subplot titles), as a dict
    without plotly's default template (trusted_figure sets TEMPLATE)."""
    layout: dict[str, Any] = make_subplots(**grid).layout.to_plotly_json()
    layout.pop("template", None)
    return layout
