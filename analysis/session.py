"""OpenRuns, the object every analysis CLI is a veneer over: runs read once, asked many times
(`open_runs(paths) -> OpenRuns` and the other entry functions are in api.py).

    from analysis import open_runs
    runs = open_runs(["traces/naive.rank0.sqlite", "traces/naive.rank1.sqlite"])  # one run, two files
    runs.overlap().steps            # a DataFrame: one row per rank and step
    runs.collectives().by_rank      # the collectives view
    runs.timeline_panels()          # the timeline's panels (timeline/timeline_page.write_timeline draws them)
    runs.report("reports/")         # the report folder analysis.report writes (report/report_folder.py)
    runs.compare(["old.sqlite"], ["step_ms:+5%"])  # the baseline gate (analysis.report --baseline)

Paths become runs by the one rule (run_files.find_runs). Each run is read once into one object,
run/loaded_run.LoadedRun, which every feature and view takes (`.loaded(i)`). Serially (jobs=1, no Dask)
the object measures each run in one piece and that LoadedRun serves the metrics, the collectives view
and the timeline; with jobs > 1 or a Dask address each file is a task (parallel/per_file.py) and the
run's results are merged by the loader's rules; a view that needs the run's events then reads the run
once more, here. A step, rank or warm-up skip the runs do not have is a TraceError naming what they
have. Every CLI is a veneer over one of these methods: overlap (.overlap), collectives (.collectives),
timeline (.timeline), report (.report; with --baseline, .compare).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from analysis.collectives.collectives_view import CollectivesView, run_call_rows, view_of_rows
from analysis.errors import TraceError
from analysis.options import AnalysisOptions
from analysis.overlap.analyze import Analysis, analyze_run, check_selection, concat_analyses, selected
from analysis.overlap.metrics import ACROSS_COLUMNS, run_across_ranks
from analysis.parallel.file_task import analyze_file
from analysis.parallel.per_file import RunResult, analyze_groups
from analysis.parallel.tasks import Outcome
from analysis.run.loaded_run import LoadedRun, load_run
from analysis.run.run_files import RunFiles, find_runs, shown_files
from analysis.timeline.lanes import Selection
from analysis.trace.patterns import Patterns

if TYPE_CHECKING:
    from analysis.parallel.pool import Progress
    from analysis.report.compare import Comparison
    from analysis.report.gate import Rule
    from analysis.report.report_folder import ReportResult
    from analysis.trace.readers.read import StartedRead


class OpenRuns:
    """Runs opened once with their options; each is loaded (or analysed file by file) the first time it is
    asked for. `patterns`: in place of the options' (a Patterns may set more than the options do);
    `progress`: ticked per file; `task(path)`: the per-file task instead of file_task.analyze_file;
    keep_traces=False: each run is loaded each time it is asked for, never kept; needs_events: the
    caller will ask for the runs' events (collectives, timeline, report), so a run measured in one
    piece keeps its collectives view's rows; overlap_detail=False: a run measured in one piece leaves out
    what only the overlap command shows, its analysis' by_op_phase and its across_ranks (no rows: the
    report's command, which shows neither); `started`: the first run's first file's read, started
    already (trace/readers/read.py), which the run's first load takes and then closes."""

    def __init__(
        self,
        runs: Sequence[RunFiles],
        options: AnalysisOptions | None = None,
        *,
        patterns: Patterns | None = None,
        progress: Progress | None = None,
        task: Callable | None = None,
        keep_traces: bool = True,
        needs_events: bool = False,
        overlap_detail: bool = True,
        started: StartedRead | None = None,
    ):
        self.runs = list(runs)
        self.options = options or AnalysisOptions()
        self.patterns = patterns or self.options.patterns
        self.progress, self.task = progress, task
        self.keep_traces, self.needs_events, self.overlap_detail = keep_traces, needs_events, overlap_detail
        self._loaded: dict[int, LoadedRun] = {}
        self._results: list[RunResult] | None = None
        self._started = started

    @property
    def jobs(self) -> int:
        return self.options.jobs or 1

    @property
    def cache(self) -> bool | None:
        """The load cache (cache/loads.py): False with no_cache, else None: on unless ANALYSIS_NO_CACHE is set."""
        return False if self.options.no_cache else None

    def loaded(self, i: int) -> LoadedRun:
        """Run i read and measured (loaded_run.load_run), once per OpenRuns when traces are kept."""
        if i in self._loaded:
            return self._loaded[i]
        started, self._started = (self._started, None) if i == 0 else (None, self._started)
        try:
            run = load_run(self.runs[i].paths, self.patterns, cache=self.cache, started=started)
        finally:
            if started is not None:  # read from, or not needed (the load came from the cache)
                started.close()
        if self.keep_traces:
            self._loaded[i] = run
        return run

    def results(self) -> list[RunResult]:
        """Every run's RunResult (computed once): in one piece here, or file by file with jobs > 1 or a
        Dask address; failed runs carry their error."""
        if self._results is None:
            if self.jobs > 1 or self.options.dask is not None:  # file by file, in processes or on Dask
                self._results = self._per_file()
            else:
                self._results = [self._in_one_piece(i) for i in range(len(self.runs))]
        return self._results

    def _in_one_piece(self, i: int) -> RunResult:
        """Run i loaded in one piece and measured from its LoadedRun (the collectives view's rows kept
        when events are needed; else only the plain call rows the overlap figures need are made)."""
        run = self.runs[i]
        try:
            loaded = self.loaded(i)
            rows = run_call_rows(loaded) if self.needs_events else None
            skip, detail = self.options.skip_steps, self.overlap_detail
            analysis = analyze_run(loaded, skip_steps=skip, rows=None if rows is None else rows[0], op_phase=detail)
            spread = run_across_ranks(loaded, analysis.steps) if detail else pd.DataFrame(columns=ACROSS_COLUMNS)
        except TraceError as e:
            self._tick(run, str(e))
            return RunResult(run, None, pd.DataFrame(), error=str(e), failed=run.paths)
        self._tick(run, None)
        return RunResult(run, analysis, spread, call_rows=rows)

    def _tick(self, run: RunFiles, error: str | None) -> None:
        if self.progress is not None:
            for path in run.paths:
                self.progress.tick(Outcome(path, error=error))

    def _per_file(self) -> list[RunResult]:
        """Every file a task (parallel/per_file.py), each run merged from its files' results."""
        task = self.task
        if task is None:  # the per-file loads keep to the cache setting
            task = partial(analyze_file, patterns=self.patterns, skip_steps=self.options.skip_steps, cache=self.cache)
        return analyze_groups(self.runs, task, jobs=self.jobs, dask=self.options.dask, progress=self.progress)

    def errors(self) -> list[str]:
        """The one-line error of every run that failed."""
        return [r.error for r in self.results() if r.error is not None]

    def good(self) -> list[RunResult]:
        return [r for r in self.results() if r.analysis is not None]

    def overlap(self, step: int | None = None, rank: int | None = None) -> Analysis:
        """The overlap metrics of every run that loaded (analyze.Analysis), only step/rank when given."""
        analyses = [r.analysis for r in self.good() if r.analysis is not None]
        if not analyses:
            raise TraceError(self.errors()[0] if len(self.errors()) == 1 else "; ".join(self.errors()))
        return selected(concat_analyses(analyses), step, rank)

    def check_selection(self, step: int | None = None, rank: int | None = None) -> None:
        """A TraceError naming what the runs have when they lack rank `rank` or step `step`
        (analyze.check_selection over every run that loaded, the failed runs' errors when none did)."""
        check_selection(self.overlap(), step, rank)

    def collectives(
        self, rank: int | None = None, step: int | None = None, peak_busbw: float | None = None
    ) -> CollectivesView:
        """The collectives view of every run that loaded (collectives_view.CollectivesView)."""
        pairs = [
            r.call_rows if r.call_rows is not None else run_call_rows(self.loaded(i))
            for i, r in enumerate(self.results())
            if r.analysis is not None
        ]
        if not pairs:
            raise TraceError("; ".join(self.errors()) or "no run")
        return view_of_rows(pairs, rank=rank, step=step, peak_busbw=peak_busbw, skip_steps=self.options.skip_steps)

    def timeline_panels(self, selection: Selection | None = None, width_px: int = 1600) -> list[tuple]:
        """(panel, PanelSummary) per run that loaded, for timeline/timeline_page.write_timeline."""
        from analysis.timeline.timeline_page import trace_panel

        selection = selection or Selection()
        shown = shown_files([r.run.label for r in self.results()])  # two a/fsdp.sqlite, b/fsdp.sqlite: told apart
        out = []
        for i, r in enumerate(self.results()):
            if r.analysis is None:
                continue
            out.append(
                trace_panel(r.run.label, selection, self.loaded(i), r.analysis.steps, width_px, file_name=shown[i])
            )
        return out

    def timeline(
        self,
        output: str | Path,
        *,
        step: int | None = None,
        rank: int | None = None,
        width_px: int = 1600,
        self_contained: bool = False,
    ) -> TimelinePage:
        """Write the runs' timeline page to `output` (one panel per run, only step/rank when given:
        a TraceError naming what the runs have when they lack it) from the runs as loaded; returns
        the page's path, figure and one PanelSummary per panel. Refuses nothing about `output`:
        the CLI checks it (timeline_page.check_output) before any work."""
        from analysis.render.html_page import PlotlyJs
        from analysis.timeline.timeline_page import write_timeline
        from analysis.trace.run_info import labelled, summary_notes

        self.check_selection(step, rank)
        selection = Selection(step=step, rank=rank)
        panels, rows = [], []
        for panel, row in self.timeline_panels(selection, width_px):
            panels.append(panel)
            rows.append(row)
        summaries = [r.analysis.summary for r in self.good() if r.analysis is not None]
        design = [summary_notes(s)[0] for s in summaries]
        below = labelled([row.implementation for row in rows], design)
        title = "Timeline: " + " vs ".join(r.implementation for r in rows)
        js = PlotlyJs(self_contained)
        path, fig = write_timeline(panels, Path(output), title, selection, width_px, js, notes=below)
        notes = [s["ranks_note"].iloc[0] for s in summaries]
        return TimelinePage(path, fig, rows, notes, design)

    def report(
        self,
        out_dir: str | Path,
        *,
        step: int | None = None,
        rank: int | None = None,
        timelines: bool = True,
        peak_busbw: float | None = None,
        self_contained: bool = False,
        images: Sequence[str] = (),
        progress: Callable[[str], object] | None = None,
        overwrite: bool = False,
    ) -> ReportResult:
        """Write the comparison report folder `python -m analysis.report` writes (index.html, one
        timeline per run and a side-by-side page unless timelines=False, summary.csv, results.db,
        plotly.js beside the pages unless self_contained, img/*.png|svg for images=("png", "svg"))
        from the runs as loaded, only step/rank when given; `progress`: called with a line per page.
        Files in `out_dir` that this tool did not write are refused (a TraceError) before anything is
        read or written, and so is a report of other runs there unless `overwrite`; a run that failed
        raises report_folder.RunsFailed naming it. Returns what was written (report_folder.ReportResult)."""
        from analysis.report.report_folder import write_report

        return write_report(
            self,
            Path(out_dir),
            step=step,
            rank=rank,
            timelines=timelines,
            peak_busbw=peak_busbw,
            self_contained=self_contained,
            images=images,
            progress=progress,
            overwrite=overwrite,
        )

    def compare(self, baseline: Iterable[str | Path], fail_if: Iterable[str | Rule] = ()) -> Comparison:
        """The baseline gate (`analysis.report NEW --baseline OLD`) for these runs, which must be one run:
        per-metric deltas, `.verdict()` and `.failed` for the `fail_if` rules ("exposed_comm_ms:+10%"),
        the new run's figures from its load here, the baseline's (all its paths one run) from its own
        OpenRuns, read after the rules and paths are checked (report/compare.py); writes nothing."""
        from analysis.report.compare import check_apart, compare_figures, rules_of, trace_figures

        if len(self.runs) != 1:
            raise TraceError(f"the gate compares one run; these paths are {len(self.runs)} runs")
        new = self.loaded(0)
        rules = rules_of(fail_if)
        old = [Path(p) for p in baseline]
        check_apart(self.runs[0].paths, old)
        figures = trace_figures(new, self.runs[0].paths)
        if not old:
            raise TraceError("no trace path given")
        base = OpenRuns(find_runs(old, merge=True), self.options, patterns=self.patterns, keep_traces=False)
        return compare_figures(figures, trace_figures(base.loaded(0), old), rules)


@dataclass(frozen=True)
class TimelinePage:
    """A written timeline page: its path, the plotly figure, one PanelSummary per run, each run's
    missing-ranks note ('' when none) and its design notes (trace/run_info.py; the page shows them)."""

    path: Path
    figure: Any
    panels: list
    notes: list[str]
    design_notes: list[list[str]] = field(default_factory=list)
