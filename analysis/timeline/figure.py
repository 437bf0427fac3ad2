"""Turn timeline panels (generic segment frames) into one plotly figure of stacked panels.

Every lane is a row of thick WebGL (scattergl) line segments, one trace per category so colours
and legend entries are shared by all panels; an invisible marker at each segment's middle carries
the hover text; step ranges carry their number as text. All panels share the x axis: milliseconds
since each panel's own origin. A panel with an `overview` (the whole run) draws it too, hidden,
and two buttons switch every panel between its step and its whole run.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from analysis.render.drop_downs import Owner, choice_menus, choice_panels, opened_choice
from analysis.render.figure_dicts import stacked_layout, trusted_figure
from analysis.timeline.panel import Panel, merge_subpixel, panel_pixel_ns
from analysis.timeline.style import (
    CATEGORY_COLOURS,
    CATEGORY_LABELS,
    category_colour,
    category_order,
    category_rows,
    highlight_bands,
    hover_traces,
)

LANE_PX = 22  # height of one lane in the page
PANEL_GAP_PX = 80  # room between panels for the panel title
TOP_PX, BOTTOM_PX = 120, 60  # room above the first panel (buttons, title, toolbar) and for the time axis
TOP_NO_BUTTONS_PX = 70  # above the first panel when there are no step/whole-run buttons: title and toolbar
LEGEND_ROW_PX = 27  # one legend entry at font size 11, with plotly's spacing
LEGEND_PX = 230  # right margin holding the legend, clear of the plot and the toolbar above it
LEGEND_RANK = {c: i for i, c in enumerate(CATEGORY_COLOURS)}  # the legend in the palette's order
# a step range is labelled when its visible part holds the label with room to spare: the text is WebGL, not
# clipped to the plot, so a label wider than its range would spill over its neighbours and the axis labels
STEP_LABEL_CHAR_PX, STEP_LABEL_PAD_PX = 7, 24  # per character of the 11 px font, and the room either side
HOVER_PX = 4  # hover labels are merged like the lines, at this many pixels: a mouse cannot pick finer


def _line_xy(start: np.ndarray, end: np.ndarray, lane: np.ndarray, origin_ns: int) -> tuple[np.ndarray, np.ndarray]:
    """Flattened [start, end, NaN] x values (ms) and [lane, lane, NaN] y values for scattergl lines."""
    n = len(start)
    x = np.full((n, 3), np.nan, dtype=np.float32)  # float32 ms: sub-microsecond over a 2 s view, half the bytes
    x[:, 0] = (start - origin_ns) / 1e6
    x[:, 1] = (end - origin_ns) / 1e6
    y = np.full((n, 3), np.nan, dtype=np.float32)  # lane numbers are exact in float32: half the bytes
    y[:, 0] = y[:, 1] = lane.astype(np.float32)
    return x.ravel(), y.ravel()


def _step_labels(seg: pd.DataFrame, panel: Panel, width_px: int, visible: bool) -> dict | None:
    """The step number written on each step range whose visible part holds it, in the middle of that part."""
    rows = np.flatnonzero(np.asarray(seg["category"] == "step"))  # a few rows: numpy, not a pandas frame of them
    lo, hi = panel.window_ns
    s, e = np.maximum(seg["start"].to_numpy()[rows], lo), np.minimum(seg["end"].to_numpy()[rows], hi)
    names = seg["name"].to_numpy()[rows]
    chars = np.array([len(n) if isinstance(n, str) else np.nan for n in names], dtype=float)  # no name: no label
    label_px = STEP_LABEL_CHAR_PX * chars + STEP_LABEL_PAD_PX
    wide = (e - s) >= label_px * panel_pixel_ns(panel, width_px)
    if not wide.any():
        return None
    return dict(  # WebGL like the lanes: SVG text would sit under their canvas
        type="scattergl",
        x=((s + e)[wide] / 2 - panel.origin_ns) / 1e6,
        y=seg["lane"].to_numpy()[rows][wide],
        mode="text",
        text=names[wide],
        textfont=dict(size=11, color="#222222"),
        hoverinfo="skip",
        showlegend=False,
        name="step numbers",
        visible=visible,
    )


def _panel_traces(panel: Panel, width_px: int, visible: bool, in_legend: set[str]) -> list[dict]:
    """Every trace of one level of a panel (dicts, validated once by the figure): per category its
    lines and hover markers, and step labels."""
    pixel_ns = panel_pixel_ns(panel, width_px)
    seg = panel.segments if panel.merged_pixel_ns == pixel_ns else merge_subpixel(panel.segments, pixel_ns)
    # One label per few pixels is all a mouse can pick. Merging runs per (lane, category), so one merge
    # of the whole level gives each category what merging it alone would.
    hover = hover_traces(merge_subpixel(seg, pixel_ns * HOVER_PX), panel.origin_ns, visible)
    lines = category_rows(seg)
    start, end, lane = (seg[c].to_numpy() for c in ("start", "end", "lane"))  # taken per category as arrays
    out: list[dict] = []
    for category in category_order(list(lines)):
        rows = lines[category]
        x, y = _line_xy(start[rows], end[rows], lane[rows], panel.origin_ns)
        out.append(
            dict(
                type="scattergl",
                x=x,
                y=y,
                mode="lines",
                line=dict(width=LANE_PX * 0.62, color=category_colour(category)),
                hoverinfo="skip",
                name=CATEGORY_LABELS.get(category, category),
                legendgroup=category,
                legendrank=LEGEND_RANK.get(category, 1000),
                showlegend=category not in in_legend,  # hidden traces leave the legend: each level has its own
                visible=visible,
            )
        )
        in_legend.add(category)
        out.append(hover[category])
    labels = _step_labels(seg, panel, width_px, visible)
    return [*out, labels] if labels is not None else out


def _rank_bands(panel: Panel, axes: tuple[str, str]) -> list[dict]:
    """A faint band behind every other rank's lanes, so the eye keeps ranks apart (one shape per rank,
    as plotly's add_hrect draws it: the subplot's whole width)."""
    if panel.lanes.empty:
        return []
    rank, lane = panel.lanes["rank"].to_numpy(), panel.lanes["lane"].to_numpy()
    order = np.lexsort((lane, rank))  # by rank, then lane (numpy: a groupby costs more than the rest of the panel)
    rank, lane = rank[order], lane[order]
    first = np.r_[True, rank[1:] != rank[:-1]]  # each rank's top lane
    last = np.r_[first[1:], True]  # and its bottom one
    return [
        dict(
            fillcolor="#f3f3f3",
            layer="below",
            line=dict(width=0),
            type="rect",
            x0=0,
            x1=1,
            xref=f"{axes[0]} domain",
            y0=top - 0.5,
            y1=bottom + 0.5,
            yref=axes[1],
        )
        for i, (top, bottom) in enumerate(zip(lane[first].tolist(), lane[last].tolist(), strict=True))
        if i % 2
    ]


def _axes(row: int) -> tuple[str, str]:
    """The x and y axis references ('x2', 'y2') of the figure's subplot at (row, 1) of one column."""
    return ("x", "y") if row == 1 else (f"x{row}", f"y{row}")


def _ms_range(panels: list[Panel]) -> list[float]:
    lo = min((p.window_ns[0] - p.origin_ns) / 1e6 for p in panels)
    hi = max((p.window_ns[1] - p.origin_ns) / 1e6 for p in panels)
    return [lo, hi]


def _level_buttons(layout: dict, panels: list[Panel], is_overview: list[bool], plot_px: int) -> list[dict]:
    """Buttons above the first panel: each panel's step, or each panel's whole run (x range and traces)."""
    axes = [k for k in layout if k.startswith("xaxis")]
    whole = [p.overview or p for p in panels]
    step_label = "one step" + (" each" if len(panels) > 1 else "")
    # one panel: its title follows the view (the opened step's figures, or the whole run's)
    titles = [panels[0].title, whole[0].title] if len(panels) == 1 and panels[0].overview is not None else []
    buttons = [
        dict(
            label=label,
            method="update",
            args=[
                {"visible": [o == show_overview for o in is_overview]},
                {f"{a}.range": rng for a in axes} | ({"annotations[0].text": titles[i]} if titles else {}),
            ],
        )
        for i, (label, show_overview, rng) in enumerate(
            ((step_label, False, _ms_range(panels)), ("whole run", True, _ms_range(whole)))
        )
    ]
    menus = [
        dict(
            type="buttons",
            direction="right",
            buttons=buttons,
            x=0,
            xanchor="left",
            y=1 + 62 / plot_px,
            yanchor="bottom",
            pad=dict(t=0, b=0, l=0, r=0),
            showactive=True,
            active=0,
        )
    ]
    if len(panels) == 1 and panels[0].overview is not None and len(panels[0].overview.steps) > 1:
        menus.append(_step_menu(panels[0], axes, is_overview, plot_px))
    return menus


def _step_menu(panel: Panel, axes: list[str], is_overview: list[bool], plot_px: int) -> dict:
    """A drop-down beside the buttons: any step of the whole run, drawn at the whole run's detail, titled with
    its figures; it reads the opened step until another is chosen."""
    origin = panel.origin_ns
    steps = panel.overview.steps if panel.overview is not None else ()
    buttons = [
        dict(
            label=f"step {step}",
            method="update",
            args=[
                {"visible": list(is_overview)},
                {
                    **{f"{a}.range": [(lo - origin) / 1e6, (hi - origin) / 1e6] for a in axes},
                    **({"annotations[0].text": title} if title else {}),
                },
            ],
        )
        for step, lo, hi, title in steps
    ]
    return dict(
        type="dropdown",
        buttons=buttons,
        x=0.22,
        xanchor="left",
        y=1 + 62 / plot_px,
        yanchor="bottom",
        pad=dict(t=0, b=0, l=0, r=0),
        showactive=True,
        active=next((i for i, (_, lo, _, _) in enumerate(steps) if lo == panel.window_ns[0]), -1),  # the opened step
    )


def build_figure(
    panels: list[Panel], width_px: int = 1600, x_title: str = "time since the chosen step's start (ms)"
) -> go.Figure:
    """Stacked panels sharing one time axis; sub-pixel work merged at full-view resolution."""
    if not panels:
        raise ValueError("build_figure needs at least one panel")
    heights = [max(len(p.lanes), 1) * LANE_PX + PANEL_GAP_PX for p in panels]
    plot_px = sum(heights)
    spacing = PANEL_GAP_PX / plot_px * 0.8 if len(panels) > 1 else 0.0
    layout = stacked_layout([p.title for p in panels], heights, spacing)  # make_subplots' grid, unvalidated
    in_legend: set[str] = set()
    in_whole_legend: set[str] = set()  # the whole-run level's legend entries, shown when it is
    is_overview: list[bool] = []
    traces: list[dict] = []
    shapes: list[dict] = []
    owners: list[Owner] = []  # per trace, and per shape, the panel's choice it draws (render/drop_downs.py)
    shape_owners: list[Owner] = []
    if any(p.choices for p in panels) and any(p.overview is not None for p in panels):
        raise ValueError("build_figure draws panels with choices or panels with an overview, not both")
    for row, panel in enumerate(panels, start=1):
        axes = _axes(row)
        before = set(in_legend)  # a choice, when shown, names in the legend what no earlier panel does
        opened: Owner = (row, opened_choice(panel)) if panel.choices else None
        levels = [(panel, True), *([(panel.overview, False)] if panel.overview is not None else [])]
        drawn = 0
        for level, visible in levels:
            for trace in _panel_traces(level, width_px, visible, in_legend if visible else in_whole_legend):
                traces.append({**trace, "xaxis": axes[0], "yaxis": axes[1]})
                is_overview.append(not visible)
                owners.append(opened)
                drawn += 1
        if drawn:  # add_hrect skipped subplots without traces
            shapes += _rank_bands(panel, axes)
        shapes += highlight_bands(panel, axes, in_legend)
        shape_owners += [opened] * (len(shapes) - len(shape_owners))
        for j, choice in choice_panels(panel):  # drawn hidden, each from its own step's start
            named = set(before)
            hidden = [{**t, "xaxis": axes[0], "yaxis": axes[1]} for t in _panel_traces(choice, width_px, False, named)]
            traces += hidden
            is_overview += [False] * len(hidden)
            owners += [(row, j)] * len(hidden)
            bands = [*(_rank_bands(choice, axes) if hidden else []), *highlight_bands(choice, axes, named)]
            shapes += [{**b, "visible": False} for b in bands]
            shape_owners += [(row, j)] * len(bands)
        n_lanes = max(len(panel.lanes), 1)
        layout["yaxis" if row == 1 else f"yaxis{row}"].update(
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
        layout["xaxis" if row == 1 else f"xaxis{row}"].update(
            showgrid=True, gridcolor="#eeeeee", zeroline=False, range=_ms_range(panels)
        )
    layout["xaxis" if len(panels) == 1 else f"xaxis{len(panels)}"]["title"] = dict(text=x_title)
    for title in layout.get("annotations", []):  # titles from the plot's left edge, clear of the legend
        title.update(x=0, xanchor="left", xref="paper", align="left")
    top = TOP_PX if any(is_overview) else TOP_NO_BUTTONS_PX
    layout.update(
        shapes=shapes,
        height=max(plot_px, LEGEND_ROW_PX * len(in_legend | in_whole_legend) + 20)
        + top
        + BOTTOM_PX,  # the legend never scrolls
        hovermode="closest",
        margin=dict(l=170, r=LEGEND_PX, t=top, b=BOTTOM_PX),
        legend=dict(orientation="v", x=1.01, xanchor="left", y=1, yanchor="top", font=dict(size=11)),
    )
    if any(is_overview):
        layout["updatemenus"] = _level_buttons(layout, panels, is_overview, plot_px)
    if any(p.choices for p in panels):
        area_px = layout["height"] - top - BOTTOM_PX
        layout["updatemenus"] = choice_menus(layout, panels, owners, shape_owners, area_px)
    # One unchecked hand-over (figure_dicts.py): every add_trace, add_shape or update call re-validates
    # what the figure holds, and the panels' traces are many.
    return trusted_figure(traces, layout)


def count_drawn_segments(fig: go.Figure) -> int:
    """Number of line segments a figure draws (every third x value is a segment's start)."""
    return sum(len(t.x) // 3 for t in fig.data if isinstance(t, go.Scattergl) and t.mode == "lines")
