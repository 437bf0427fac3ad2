"""The side-by-side page: one step of every implementation, fastest first, stacked on one time scale,
each with its backward pass outlined, so where communication sits against backward reads at a glance.

Each panel is the timeline (timeline/timeline_page.py) of one rank's one step: the representative step
(timeline/representative.py: closest to the run's medians), time zero at that step's start.
"""

from __future__ import annotations

import dataclasses
import html
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from analysis.render import palette
from analysis.render.html_page import BESIDE_THE_PAGE, PlotlyJs
from analysis.timeline.lanes import Segments, Selection, build_panel, build_step_panels
from analysis.timeline.panel import Panel
from analysis.timeline.representative import RULE, SWITCH, representative_step

if TYPE_CHECKING:
    import pandas as pd
    import plotly.graph_objects as go

    from analysis.run.loaded_run import LoadedRun

PAGE_NAME = "timelines/side_by_side.html"
INTRO = (
    "One step of each implementation, fastest first, on one time scale: time zero is the step's start. "
    "Each panel is that run's representative step (named under the chart), the lanes of the rank nearest "
    "the medians. The outlined box is the "
    "backward pass (first to last GPU kernel launched in backward; on CPU traces the backward ranges): "
    "communication inside it can overlap backward, and the overlap strip says which communication compute "
    "hid and which it left exposed."
)
CHOICES = (
    "Another step or rank: the drop-down left of each panel's title offers every step of the rank it opens on and "
    "every rank in the step it opens on (every step of every rank would make the page too large); any step of any "
    "rank: each run's timeline page ('whole run'), or "
    "python -m analysis.timeline TRACE --step N --rank R."
)


def _ms(value: object) -> str:
    return "-" if value is None else f"{float(value):.2f} ms"  # type: ignore[arg-type]


def compare_title(label: str, colour: str, step: int | None, rank: int | None, row: pd.Series | None) -> str:
    """The panel title: the implementation in its colour, which step and rank, and that step's figures
    from the analysis (the report table's per-step source)."""
    head = palette.coloured_name(f"<b>{html.escape(label)}</b>", colour)
    if step is None or row is None:
        return f"{head} — whole run (no numbered steps)"
    pct = row.get("overlap_pct")
    overlapped = "-" if pct is None or pct != pct else f"{pct:.1f}%"
    return (
        f"{head} — step {step}, rank {rank}: step {_ms(row['step_ms'])}, comm {_ms(row['comm_ms'])}, "
        f"overlapped {overlapped}, exposed comm {_ms(row['exposed_comm_ms'])}"
    )


def step_choices(steps: pd.DataFrame, chosen: tuple[int, int]) -> list[tuple[int, int]]:
    """(step, rank) a panel's drop-down offers: every step of the chosen rank, then every other rank in the
    chosen step (not every step of every rank: the page would grow with both)."""
    step, rank = chosen
    numbered = steps.loc[steps["step"].notna(), ["step", "rank"]].drop_duplicates()
    mine = sorted(int(k) for k in numbered.loc[numbered["rank"] == rank, "step"])
    others = sorted(int(r) for r in numbered.loc[(numbered["step"] == step) & (numbered["rank"] != rank), "rank"])
    return [(k, rank) for k in mine] + [(step, r) for r in others]


def compare_panel(
    label: str,
    colour: str,
    run: LoadedRun,
    steps: pd.DataFrame,
    width_px: int = 1600,
    segments: Segments | None = None,
) -> Panel:
    """One implementation's panel: its representative step and rank, backward outlined, titled in its colour,
    with the steps and ranks of step_choices behind its drop-down (`segments`: the run's lanes.run_segments
    when the caller draws it more than once)."""
    from analysis.timeline.timeline_page import with_backward, with_backward_all

    chosen = representative_step(steps)

    step_of, rank_of = steps["step"].to_numpy(), steps["rank"].to_numpy()  # looked up once per view: numpy

    def title(step: int | None, rank: int | None) -> str:
        at = np.flatnonzero((step_of == step) & (rank_of == rank)) if step is not None else np.array([], dtype=int)
        return compare_title(label, colour, step, rank, steps.iloc[at[0]] if len(at) else None)

    if chosen is None:  # the whole run: not trace_panel, whose title and figures this page does not show
        return with_backward(
            build_panel(run, Selection(), title=title(None, None), width_px=width_px, segments=segments), run
        )
    choices = step_choices(steps, chosen)
    # the opened view first, then the others of its drop-down: every view of the run drawn in one pass
    drawn = [chosen, *(c for c in choices if c != chosen)] if len(choices) > 1 else [chosen]
    views = build_step_panels(run, [(k, r, title(k, r)) for k, r in drawn], width_px=width_px, segments=segments)
    panels = dict(zip(drawn, with_backward_all(views, run), strict=True))
    if len(choices) < 2:
        return panels[chosen]
    menu = tuple((f"step {k}, rank {r}", None if (k, r) == chosen else panels[(k, r)]) for k, r in choices)
    return dataclasses.replace(panels[chosen], choices=menu)


def write_compare(
    output: Path,
    panels: list[Panel],
    labels: list[str],
    plotly_js: PlotlyJs = BESIDE_THE_PAGE,
    width_px: int = 1600,
    notes: Sequence[str] = (),
) -> tuple[Path, go.Figure]:
    """Write the side-by-side page of the panels (in the order given: fastest first), the rule that chose
    each panel's step and `notes` (the runs' design notes) under the chart."""
    from analysis.render.html_page import notes_html, write_page
    from analysis.timeline.figure import build_figure

    fig = build_figure(panels, width_px=width_px, x_title="time since the step's start (ms), each panel its own step")
    title = "Side by side: " + ", ".join(labels)
    switch = CHOICES if any(p.choices for p in panels) else SWITCH
    below = [f"Each panel shows {RULE}, on that step's rank nearest the medians.", *notes, switch]
    write_page(output, title, [fig, notes_html(below)], intro=INTRO, plotly_js=plotly_js)
    return output, fig
