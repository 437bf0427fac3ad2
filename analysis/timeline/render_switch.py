"""A drop-down per panel that shows another of its `choices` (other steps or ranks of the same run) in its place.

Every choice is drawn hidden, at its own step's detail and from its own step's start, on the panel's axes; a
choice's button shows its traces and shapes and hides the panel's others, puts its title and lanes in place,
and widens the shared time axis to the longest step on show (the other panels keep their opened step's).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from analysis.timeline.panel import Panel

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
