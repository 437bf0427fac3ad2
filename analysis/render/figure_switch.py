"""One figure per choice (a step, a rank), drawn as one figure with a drop-down that shows one choice at a time.

Every choice's traces are in the page, hidden but the chosen one's; a choice's button shows its traces and
puts its title, axes, shapes and annotations in place, so each choice reads exactly as its own figure would.
"""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go

from analysis.render.figure_dicts import trusted_figure

# What a choice brings to the layout: the parts of a figure that differ from choice to choice.
SWITCHED = ("title", "xaxis", "yaxis", "shapes", "annotations", "height")
MENU_PX = 36  # added above the plot for the drop-down, between the title and the plot


def _room_for_menu(layout: dict) -> dict:
    """The layout MENU_PX taller, the room added to the top margin (under the title)."""
    margin = layout.get("margin", {})
    height = layout.get("height")
    return {
        **layout,
        "margin": {**margin, "t": margin.get("t", 100) + MENU_PX},
        **({"height": height + MENU_PX} if height else {}),
    }


def _layout_of(fig: go.Figure) -> dict:
    """The switched parts of a figure's layout, as plotly.js takes them."""
    layout = _room_for_menu(fig.layout.to_plotly_json())
    return {key: layout.get(key, [] if key in ("shapes", "annotations") else {}) for key in SWITCHED}


def switched_figure(choices: Sequence[tuple[str, go.Figure]], active: int = 0) -> go.Figure:
    """One figure of every choice's (label, figure): the `active` one shown, a drop-down above the plot's
    top left corner naming each choice by its label (the figure MENU_PX taller for it). A single choice is
    returned as it is."""
    if not choices:
        raise ValueError("switched_figure needs at least one choice")
    if len(choices) == 1:
        return choices[0][1]
    owner = [i for i, (_, fig) in enumerate(choices) for _ in fig.data]
    data = [
        {**trace.to_plotly_json(), "visible": i == active} for i, (_, fig) in enumerate(choices) for trace in fig.data
    ]
    buttons = [
        dict(label=label, method="update", args=[{"visible": [o == i for o in owner]}, _layout_of(fig)])
        for i, (label, fig) in enumerate(choices)
    ]
    shown = _room_for_menu(choices[active][1].layout.to_plotly_json())
    menu = dict(
        type="dropdown",
        buttons=buttons,
        active=active,
        showactive=True,
        x=0,  # just above the plot's top left corner, under the title
        xanchor="left",
        y=1,
        yanchor="bottom",
        pad=dict(t=0, b=6, l=0, r=0),
        font=dict(size=11),
    )
    return trusted_figure(data, {**shown, "updatemenus": [menu]})
