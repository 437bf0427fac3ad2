"""Timeline pages: one panel per trace with the analysis figures in its title, and the page."""

from __future__ import annotations

import dataclasses
import html
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import plotly.graph_objects as go

from analysis.errors import TraceError
from analysis.render import palette
from analysis.render.html_page import (
    BESIDE_THE_PAGE,
    PlotlyJs,
    check_plotly_file,
    notes_html,
    write_page,
    written_by_us,
)
from analysis.timeline.figure import build_figure
from analysis.timeline.lanes import Segments, Selection, build_panel
from analysis.timeline.panel import Panel
from analysis.timeline.representative import RULE, representative_step

if TYPE_CHECKING:
    import pandas as pd

    from analysis.run.loaded_run import LoadedRun


@dataclass(frozen=True)
class PanelSummary:
    """One row of the CLI's machine-readable output: a panel and the analysis figures in its title."""

    trace: str
    implementation: str
    view: str
    ranks: int
    steps: int
    segments: int
    step_ms: float | None
    comm_ms: float | None
    overlap_pct: float | None
    exposed_comm_ms: float | None
    # the same figures over the whole selection when the panel opens on one step (its 'whole run' button),
    # else None; not a column of the CSV or table (command.print_rows)
    whole_run: dict | None = None


WHOLE_RUN_KEYS = ("view", "steps", "segments", "step_ms", "comm_ms", "overlap_pct", "exposed_comm_ms")


def view_name(selection: Selection) -> str:
    step = "all steps" if selection.step is None else f"step {selection.step}"
    rank = "all ranks" if selection.rank is None else f"rank {selection.rank}"
    return f"{step}, {rank}"


def analysis_figures(selection: Selection, steps: pd.DataFrame) -> dict:
    """The analysis's metrics (overlap/metrics.py) for the selected step/rank, averaged over steps and
    ranks, from the run's per-step frame (its analysis' `steps`)."""
    from analysis.overlap.metrics import summarise

    if selection.rank is not None:
        steps = steps.loc[steps["rank"] == selection.rank]
    if selection.step is not None:
        steps = steps.loc[steps["step"] == selection.step]
    return summarise(steps)


def _figures_row(view: str, fig: dict, segments: int) -> tuple:
    """WHOLE_RUN_KEYS' values: the view's name, its steps, drawn segments and analysis figures."""
    return view, fig["steps"], segments, fig["step_ms"], fig["comm_ms"], fig["overlap_pct"], fig["exposed_comm_ms"]


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} ms"


def panel_title(implementation: str, shown: str, view: str, fig: dict, colour: str | None = None) -> str:
    """Implementation (after a square of its colour: `colour`, else the palette's for that name), the
    file as `shown`, view and the analysis's overlap figures (mean per step and rank)."""
    pct = "-" if fig.get("overlap_pct") is None else f"{fig['overlap_pct']:.1f}%"
    colour = colour or palette.implementation_colours([implementation])[implementation]
    name = palette.coloured_name(f"<b>{html.escape(implementation)}</b>", colour)
    return (
        f"{name} — {html.escape(shown)} — {view}<br>step {_ms(fig.get('step_ms'))},"
        f" comm {_ms(fig.get('comm_ms'))}, overlapped {pct}, exposed comm {_ms(fig.get('exposed_comm_ms'))}"
    )


def with_backward(panel: Panel, run: LoadedRun) -> Panel:
    """The panel (and its whole-run overview) with each step's backward pass highlighted behind its rank's lanes."""
    return with_backward_all([panel], run)[0]


def with_backward_all(panels: list[Panel], run: LoadedRun) -> list[Panel]:
    """with_backward of each panel of one run; the spans taken once per set of ranks drawn (shared, read only)."""
    spans = run.backward_spans.rename(columns={"start_ns": "start", "end_ns": "end"})
    taken: dict[tuple, pd.DataFrame] = {}
    out = []
    for panel in panels:
        ranks = tuple(panel.lanes["rank"].unique())
        if ranks not in taken:
            taken[ranks] = spans.loc[spans["rank"].isin(ranks), ["rank", "start", "end"]]
        overview = None if panel.overview is None else dataclasses.replace(panel.overview, highlight=taken[ranks])
        out.append(dataclasses.replace(panel, highlight=taken[ranks], overview=overview))
    return out


def trace_panel(
    path: str | Path,
    selection: Selection,
    run: LoadedRun,
    steps: pd.DataFrame,
    width_px: int = 1600,
    colour: str | None = None,
    file_name: str | None = None,
    segments: Segments | None = None,
) -> tuple[Panel, PanelSummary]:
    """The run's panel (titled with `file_name`, else `path`'s file name: the caller passes a name unique
    among the panels it shows, run_files.unique_tails) plus the summary row; `steps`: the run's per-step frame
    (its analysis' steps), `segments`: its lanes.run_segments when the caller draws it more than once.

    Without a step selected the panel opens on the representative step (representative.py), its title giving
    that step's figures, with the whole run one click away; the summary row is the view it opens on, its
    `whole_run` the whole selection's figures.
    `colour`: the implementation's colour in the title (a report's, where two traces share a name)."""
    trace = run.trace
    fig = analysis_figures(selection, steps)
    mine = steps if selection.rank is None else steps.loc[steps["rank"] == selection.rank]
    opening = None if selection.step is not None else representative_step(mine)
    shown = selection if opening is None else Selection(step=opening[0], rank=selection.rank)
    view = view_name(shown)
    if opening is not None:
        view = f"step {opening[0]} (representative, r{opening[1]} nearest the medians), " + view.split(", ")[1]
    figures = fig if shown == selection else analysis_figures(shown, steps)
    title = panel_title(trace.implementation, file_name or Path(path).name, view, figures, colour)
    panel = with_backward(
        build_panel(
            run,
            selection,
            title=title,
            width_px=width_px,
            opening_step=None if opening is None else opening[0],
            segments=segments,
        ),
        run,
    )
    if opening is not None and panel.overview is not None:  # the whole run and every step titled with its figures
        panel = _titled_overview(panel, trace.implementation, file_name or Path(path).name, selection, steps, colour)
    whole = None
    if opening is not None and panel.overview is not None:
        whole_row = _figures_row(view_name(selection), fig, len(panel.overview.segments))
        whole = dict(zip(WHOLE_RUN_KEYS, whole_row, strict=True))
    _, n_steps, drawn, step_ms, comm_ms, pct, exposed = _figures_row(view, figures, len(panel.segments))
    summary = PanelSummary(
        str(path), trace.implementation, view, figures["ranks"], n_steps, drawn, step_ms, comm_ms, pct, exposed, whole
    )
    return panel, summary


def _titled_overview(
    panel: Panel, implementation: str, shown: str, selection: Selection, steps: pd.DataFrame, colour: str | None
) -> Panel:
    """The panel with its overview titled with the whole selection's figures and each of its steps with
    that step's, for the buttons and the step switch (figure.py)."""
    assert panel.overview is not None

    from analysis.overlap.metrics import summarise_each_step

    def title(selected: Selection, figures: dict) -> str:
        return panel_title(implementation, shown, view_name(selected), figures, colour)

    mine = steps if selection.rank is None else steps.loc[steps["rank"] == selection.rank]
    each = summarise_each_step(mine)  # the steps' figures in one pass, not a filter and a mean per step
    titled = tuple(
        (k, lo, hi, title(Selection(k, selection.rank), each.get(k) or analysis_figures(Selection(k), mine)))
        for k, lo, hi, _ in panel.overview.steps
    )
    whole = title(selection, analysis_figures(selection, steps))
    overview = dataclasses.replace(panel.overview, title=whole, steps=titled)
    return dataclasses.replace(panel, overview=overview)


def write_timeline(
    panels: list[Panel],
    output: Path,
    title: str,
    selection: Selection,
    width_px: int = 1600,
    plotly_js: PlotlyJs = BESIDE_THE_PAGE,
    notes: Sequence[str] = (),
) -> tuple[Path, go.Figure]:
    """Write the stacked-panel page (plotly.js as `plotly_js` says) with `notes` (design notes, trace/run_info.py)
    under the chart, after the line naming the opening step's rule; returns its path and the figure."""
    opening = selection.step is None and any(p.overview is not None for p in panels)
    if selection.step is not None or opening:
        x_title = "time since the step's start (ms)" + (" (each panel's own step)" if len(panels) > 1 else "")
    else:
        x_title = "time since the first step's start (ms; trace start when there are no steps)"
    fig = build_figure(panels, width_px=width_px, x_title=x_title)
    intro = (
        "Lanes per rank: CPU step and phases, CPU communication ranges, then per GPU stream its compute "
        "(coloured by the phase that launched it) and its communication (coloured by collective), then "
        "the rank's overlap strip: communication hidden under compute, or exposed. The outlined box over a "
        "rank's lanes is its backward pass (first to last GPU kernel launched in backward; on CPU traces the "
        "backward ranges): communication inside it overlaps backward. Work narrower than a pixel is merged "
        "into blocks (the hover gives the count); zoom with the mouse."
        + (
            " It opens on one step; 'whole run' shows every step"
            + ("; the drop-down goes to any step, at the whole run's detail." if len(panels) == 1 else ".")
            if opening
            else ""
        )
    )
    below = ([f"Each panel opens on its representative step: {RULE}."] if opening else []) + list(notes)
    write_page(output, title, [fig, notes_html(below)] if below else [fig], intro=intro, plotly_js=plotly_js)
    return output, fig


def check_output(output: Path, inputs: list[Path], explicit: bool = True, self_contained: bool = False) -> None:
    """Refuse outputs that would clobber an input or are not HTML, any existing file this tool did not
    write (html_page.written_by_us, the check the report folder uses: an explicit -o is no permission
    to replace someone's own page), and unless self-contained, a plotly.js beside it that is not ours."""
    if output.suffix.lower() not in (".html", ".htm"):
        raise TraceError(f"-o {output}: the timeline is an HTML page; give a path ending in .html")
    if output.exists() and output.is_dir():
        raise TraceError(f"-o {output}: is a directory; give a file path ending in .html")
    if any(output.resolve() == p.resolve() for p in inputs):
        raise TraceError(f"-o {output}: is one of the input traces; refusing to overwrite it")
    if output.is_file() and not written_by_us(output):
        how = "choose another -o" if explicit else "pass -o to choose the output"
        raise TraceError(f"{output}: exists and was not written by this tool; refusing to overwrite it ({how})")
    if not self_contained:
        check_plotly_file(output.parent)
