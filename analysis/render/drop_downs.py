"""Drop-downs that show one choice at a time (a step, a rank) in one place of a page.

`switched_figure`: one figure per choice (its traces and layout as dicts), drawn as one figure with a
drop-down above it. Every choice's traces are in the page, hidden but the chosen one's; a choice's
button shows its traces and puts its title, axes, shapes and annotations in place, so each choice reads
exactly as its own figure would.

`choice_menus`: a drop-down per timeline panel that shows another of its `choices` (other steps or ranks
of the same run) in its place, the other panels unchanged. Every choice is drawn hidden, at its own
step's detail and from its own step's start, on the panel's axes; a choice's button shows its traces and
shapes and hides the panel's others, puts its title and lanes in place, and widens the shared time axis
to the longest step on show (the other panels keep their opened step's).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import plotly.graph_objects as go

from analysis.render.figure_dicts import ordered_figure, trusted_figure

if TYPE_CHECKING:
    from analysis.timeline.panel import Panel

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


def _layout_of(layout: dict) -> dict:
    """The switched parts of a choice's layout, as plotly.js takes them."""
    layout = _room_for_menu(layout)
    return {key: layout.get(key, [] if key in ("shapes", "annotations") else {}) for key in SWITCHED}


# One choice: its label, its traces and its layout, as the dicts a figure holds (figure_dicts.py).
Choice = tuple[str, list[dict], dict]


def switched_figure(choices: Sequence[Choice], active: int = 0) -> go.Figure:
    """One figure of every choice's (label, traces, layout): the `active` one shown, a drop-down above the
    plot's top left corner naming each choice by its label (the figure MENU_PX taller for it). A single
    choice is drawn as its own figure, without a drop-down."""
    if not choices:
        raise ValueError("switched_figure needs at least one choice")
    if len(choices) == 1:
        return ordered_figure(choices[0][1], choices[0][2])
    owner = [i for i, (_, data, _) in enumerate(choices) for _ in data]
    data = [{**trace, "visible": i == active} for i, (_, traces, _) in enumerate(choices) for trace in traces]
    buttons = [
        dict(label=label, method="update", args=[{"visible": [o == i for o in owner]}, _layout_of(layout)])
        for i, (label, _, layout) in enumerate(choices)
    ]
    shown = _room_for_menu(choices[active][2])
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


Owner = tuple[int, int] | None  # (row, choice) a trace or shape belongs to; None: not switched


def choice_panels(panel: Panel) -> list[tuple[int, Panel]]:
    """(choice index, panel) of each choice the panel draws hidden: all but the opened one (None in choices)."""
    return [(j, choice) for j, (_, choice) in enumerate(panel.choices) if choice is not None]


def opened_choice(panel: Panel) -> int:
    """The index of the opened view among the panel's choices (the one given as None)."""
    return next(j for j, (_, choice) in enumerate(panel.choices) if choice is None)


def _y_axis(row: int) -> str:
    return "yaxis" if row == 1 else f"yaxis{row}"


def _lanes_layout(row: int, shown: Panel) -> dict:
    """The row's y axis showing `shown`'s lanes."""
    n_lanes = max(len(shown.lanes), 1)
    axis = _y_axis(row)
    return {
        f"{axis}.tickvals": shown.lanes["lane"].tolist(),
        f"{axis}.ticktext": shown.lanes["label"].tolist(),
        f"{axis}.range": [n_lanes - 0.5, -0.5],
    }


def _span_ms(panel: Panel) -> tuple[float, float]:
    """The panel's window in ms from its origin."""
    return (panel.window_ns[0] - panel.origin_ns) / 1e6, (panel.window_ns[1] - panel.origin_ns) / 1e6


def choice_menus(
    layout: dict, panels: list[Panel], owners: list[Owner], shape_owners: list[Owner], area_px: float
) -> list[dict]:
    """One drop-down left of each panel's title (for panels with choices), its buttons updating that panel only."""
    x_axes = [k for k in layout if k.startswith("xaxis")]
    menus = []
    for row, panel in enumerate(panels, start=1):
        if not panel.choices:
            continue
        mine = [i for i, o in enumerate(owners) if o is not None and o[0] == row]
        others = [_span_ms(p) for r, p in enumerate(panels, start=1) if r != row]
        buttons = []
        for j, (label, choice) in enumerate(panel.choices):
            shown = panel if choice is None else choice
            shapes = {f"shapes[{i}].visible": o == (row, j) for i, o in enumerate(shape_owners) if o and o[0] == row}
            spans = [*others, _span_ms(shown)]
            rng = [min(lo for lo, _ in spans), max(hi for _, hi in spans)]
            update = {
                f"annotations[{row - 1}].text": shown.title,
                **_lanes_layout(row, shown),
                **shapes,
                **{f"{a}.range": rng for a in x_axes},
            }
            visible = {"visible": [owners[i] == (row, j) for i in mine]}
            buttons.append(dict(label=label, method="update", args=[visible, update, mine]))
        top = layout[_y_axis(row)]["domain"][1]
        menus.append(
            dict(
                type="dropdown",
                buttons=buttons,
                active=opened_choice(panel),
                showactive=True,
                x=0,  # in the lane labels' margin, left of the title: a long title runs clear of it
                xanchor="right",
                y=top + 4 / area_px,
                yanchor="bottom",
                pad=dict(t=0, b=0, l=0, r=8),
                font=dict(size=11),
            )
        )
    return menus
