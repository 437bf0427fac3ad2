"""The Python API every analysis CLI is a veneer over: `open_runs(paths) -> OpenRuns`, read once, asked many times.

    from analysis import open_runs
    runs = open_runs(["traces/naive.rank0.sqlite", "traces/naive.rank1.sqlite"])  # one run, two files
    runs.overlap().steps            # a DataFrame: one row per rank and step
    runs.collectives().by_rank      # the collectives view
    runs.timeline_panels()          # the timeline's panels (views/timeline_page.write_timeline draws them)
    runs.report("reports/")         # the report folder analysis.report writes (engine/report_folder.py)
    runs.compare(["old.sqlite"], ["step_ms:+5%"])  # the baseline gate (analysis.report --baseline)

Paths become runs by the one rule (runs.find_runs: `<run>.rank<N>` files of one folder, or every
path with merge=True, are one run; files of different runs are refused). Each run is read once
into one object, measures/loaded_run.LoadedRun (the trace, its step ranges, every rank's activity;
its collective calls and backward spans measured on first use), which every feature and view
takes (`.loaded(i)`): serially (jobs=1, no Dask) its files are loaded in one piece and that object
serves the metrics, the collectives view and the timeline; with jobs > 1 or a Dask cluster each
file is a task (groups.analyze_groups) and the run's results are merged by the loader's rules
(rank_merge.combine); the collectives view and the timeline, which need the run's events, then
read the run again, once, in this process. A step, rank or warm-up skip the runs do not have is a
TraceError naming what they have. Every CLI is a veneer over one of these methods: overlap
(.overlap), collectives (.collectives), timeline (.timeline), report (.report; with --baseline,
engine/compare.compare, whose figures .compare shares).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from analysis.engine.analyze import Analysis, analyze_trace, check_selection, concat_analyses, selected
from analysis.engine.collectives_view import CollectivesView, run_call_rows, view_of_rows
from analysis.engine.loaded import RunResult
from analysis.engine.parallel import Progress
from analysis.engine.rank_merge import across_ranks
from analysis.engine.runs import RunFiles, find_runs, load_trace, shown_files
from analysis.engine.tasks import Outcome
from analysis.errors import TraceError
from analysis.frames.patterns import Patterns
from analysis.frames.trace import Trace
from analysis.measures.collective_rows import call_rows
from analysis.measures.loaded_run import LoadedRun, measure_run
from analysis.options import AnalysisOptions, check_not_negative
from analysis.views.lanes import Selection

if TYPE_CHECKING:
    from analysis.engine.compare import Comparison
    from analysis.engine.report_folder import ReportResult
    from analysis.measures.gate import Rule


def _across_ranks_of(run: LoadedRun, steps: pd.DataFrame) -> pd.DataFrame:
    """rank_merge.across_ranks of a run loaded in one piece (its parts share one clock already)."""
    trace = run.trace
    ranges = run.step_ranges[["part", "pid", "step", "start", "end"]]
    with_part = steps.merge(trace.ranks[["rank", "part"]], on="rank", how="left")
    parts = sorted(int(p) for p in trace.ranks["part"].unique())
    by_part = {p: ranges[ranges["part"] == p].drop(columns="part") for p in parts}
    return across_ranks(with_part, by_part, dict.fromkeys(parts, 0))


class OpenRuns:
    """Runs opened once; each is loaded (or analysed file by file) the first time it is asked for."""

    def __init__(
        self,
        runs: Sequence[RunFiles],
        patterns: Patterns | None = None,
        skip_steps: int = 0,
        jobs: int = 1,
        dask: str | None = None,
        progress: Progress | None = None,
        keep_traces: bool = True,
        task: Callable | None = None,
        collectives: bool = True,
    ):
        check_not_negative(skip_steps=skip_steps)  # the check every CLI makes (analysis/options.py)
        self.runs = list(runs)
        self.patterns = patterns or Patterns()
        self.skip_steps = skip_steps
        self.jobs, self.dask = jobs, dask
        self.progress = progress
        self.keep_traces = keep_traces
        self.task = task
        # False: the caller asks for no collectives view (the overlap command), so a run loaded in one
        # piece skips its gather rows and in-time facts; .collectives() would then read the run again
        self.collectives_view = collectives
        self._loaded: dict[int, LoadedRun] = {}
        self._results: list[RunResult] | None = None

    @property
    def per_file(self) -> bool:
        """Whether the runs are analysed file by file (in processes or on Dask) rather than in one piece."""
        return self.jobs > 1 or self.dask is not None

    def loaded(self, i: int) -> LoadedRun:
        """Run i read and measured (loaded_run.measure_run), once per OpenRuns when traces are kept."""
        if i in self._loaded:
            return self._loaded[i]
        run = measure_run(load_trace(self.runs[i].paths, self.patterns), self.patterns)
        if self.keep_traces:
            self._loaded[i] = run
        return run

    def trace(self, i: int) -> Trace:
        """Run i's loaded Trace (`.loaded(i).trace`)."""
        return self.loaded(i).trace

    def results(self) -> list[RunResult]:
        """Every run's RunResult (computed once); failed runs carry their error."""
        if self._results is None:
            self._results = self._per_file() if self.per_file else [self._one_piece(i) for i in range(len(self.runs))]
        return self._results

    def _one_piece(self, i: int) -> RunResult:
        run = self.runs[i]
        try:
            loaded = self.loaded(i)
            rows = run_call_rows(loaded) if self.collectives_view else None
            plain = (
                rows[0] if rows is not None else call_rows(loaded.trace, loaded.patterns, loaded.works, loaded.calls)[0]
            )
            analysis = analyze_trace(loaded.trace, self.patterns, self.skip_steps, loaded.calls, loaded.works, plain)
            spread = _across_ranks_of(loaded, analysis.steps)
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
        from analysis.engine.groups import analyze_groups

        done = analyze_groups(
            [list(r.paths) for r in self.runs],
            self.patterns,
            self.skip_steps,
            self.jobs,
            self.dask,
            self.progress,
            self.task,
        )
        out = []
        for run, g in zip(self.runs, done, strict=True):
            if g.merged is None:
                out.append(RunResult(run, None, pd.DataFrame(), g.files, "; ".join(g.errors), g.failed))
            else:
                out.append(RunResult(run, g.merged.analysis, g.merged.across_ranks, g.files))
        return out

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
        return view_of_rows(pairs, rank=rank, step=step, peak_busbw=peak_busbw, skip_steps=self.skip_steps)

    def timeline_panels(self, selection: Selection | None = None, width_px: int = 1600) -> list[tuple]:
        """(panel, PanelSummary) per run that loaded, for views/timeline_page.write_timeline."""
        from analysis.views.timeline_page import trace_panel

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
        step: int | None = None,
        rank: int | None = None,
        width_px: int = 1600,
        self_contained: bool = False,
    ) -> TimelinePage:
        """Write the runs' timeline page to `output` (one panel per run, only step/rank when given:
        a TraceError naming what the runs have when they lack it) from the runs as loaded; returns
        the page's path, figure and one PanelSummary per panel. Refuses nothing about `output`:
        the CLI checks it (timeline_page.check_output) before any work."""
        from analysis.views.html_page import PlotlyJs
        from analysis.views.timeline_page import write_timeline

        self.check_selection(step, rank)
        selection = Selection(step=step, rank=rank)
        panels, rows = [], []
        for panel, row in self.timeline_panels(selection, width_px):
            panels.append(panel)
            rows.append(row)
        title = "Timeline: " + " vs ".join(r.implementation for r in rows)
        path, fig = write_timeline(panels, Path(output), title, selection, width_px, PlotlyJs(self_contained))
        notes = [r.analysis.summary["ranks_note"].iloc[0] for r in self.good() if r.analysis is not None]
        return TimelinePage(path, fig, rows, notes)

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
        from analysis.engine.report_folder import write_report

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
        OpenRuns, read after the rules and paths are checked (engine/compare.py); writes nothing."""
        from analysis.engine.compare import check_apart, compare_figures, rules_of, trace_figures

        if len(self.runs) != 1:
            raise TraceError(f"the gate compares one run; these paths are {len(self.runs)} runs")
        new = self.loaded(0)
        rules = rules_of(fail_if)
        old = [Path(p) for p in baseline]
        check_apart(self.runs[0].paths, old)
        figures = trace_figures(new, self.runs[0].paths)
        if not old:
            raise TraceError("no trace path given")
        base = OpenRuns(find_runs(old, merge=True), self.patterns, keep_traces=False)
        return compare_figures(figures, trace_figures(base.loaded(0), old), rules)


@dataclass(frozen=True)
class TimelinePage:
    """A written timeline page: its path, the plotly figure, one PanelSummary per run and each run's
    missing-ranks note ('' when none)."""

    path: Path
    figure: Any
    panels: list
    notes: list[str]


Paths = str | Path | Iterable[str | Path]


def _options(
    paths: Paths | AnalysisOptions, merge: bool, patterns: Patterns | None, skip_steps: int, jobs: int, **more: Any
) -> AnalysisOptions:
    """The options of an API call: `paths` when it is an AnalysisOptions (then no option may be given as a
    keyword too: a TypeError), else the keywords' (AnalysisOptions validates them as the CLIs' are; the
    keywords' `patterns`, which may set more than the options do, go to runs_of beside them)."""
    if not isinstance(paths, AnalysisOptions):
        listed = [str(paths)] if isinstance(paths, (str, Path)) else [str(p) for p in paths]
        return AnalysisOptions(listed, merge=merge, skip_steps=skip_steps, jobs=jobs, **more)
    keywords = {"merge": merge, "patterns": patterns, "skip_steps": skip_steps, "jobs": jobs, **more}
    given = [k for k, v in keywords.items() if v not in (None, False, 0, 1)]
    if given:
        raise TypeError(f"options given both as AnalysisOptions and as keywords: {', '.join(given)}")
    return paths


def runs_of(
    options: AnalysisOptions,
    found: Sequence[RunFiles] | None = None,
    jobs: int | None = None,
    progress: Progress | None = None,
    keep_traces: bool = True,
    task: Callable | None = None,
    patterns: Patterns | None = None,
    collectives: bool = True,
) -> OpenRuns:
    """The OpenRuns the options name: their runs (`found`: runs.find_runs of their paths, when the caller
    has them), patterns (`patterns` instead when given), skip_steps, dask and `jobs` (else the options',
    else 1); collectives=False: no collectives view will be asked for (OpenRuns)."""
    found = found if found is not None else find_runs(options.paths, options.merge, options.export)
    chosen = jobs or options.jobs or 1
    patterns = patterns or options.patterns
    return OpenRuns(found, patterns, options.skip_steps, chosen, options.dask, progress, keep_traces, task, collectives)


def open_runs(
    paths: Paths | AnalysisOptions,
    merge: bool = False,
    patterns: Patterns | None = None,
    skip_steps: int = 0,
    jobs: int = 1,
    dask: str | None = None,
    export: bool = False,
    progress: Progress | None = None,
    keep_traces: bool = True,
    task: Callable | None = None,
) -> OpenRuns:
    """The runs the paths hold (runs.find_runs), ready to be asked for overlap, collectives and
    timelines; nothing is read until asked. The options as the CLIs take them: an AnalysisOptions
    (analysis/options.py) in place of `paths`, or the keywords. jobs/dask: analyse file by file (module
    docstring); `task(path)`: the per-file task instead of file_task.analyze_file (it returns a FileResult)."""
    options = _options(paths, merge, patterns, skip_steps, jobs, dask=dask, export=export)
    return runs_of(options, progress=progress, keep_traces=keep_traces, task=task, patterns=patterns)


def analyze(
    paths: Paths | AnalysisOptions,
    patterns: Patterns | None = None,
    skip_steps: int = 0,
    merge: bool = False,
    export: bool = False,
    progress: Callable[[str], object] | None = None,
    jobs: int = 1,
    dask: str | None = None,
) -> Analysis:
    """open_runs(...).overlap(): every run's metrics (only the options' step and rank when an
    AnalysisOptions is given); a TraceError naming every run that failed. `progress`: called with a
    'files done / total' line as files finish."""
    options = _options(paths, merge, patterns, skip_steps, jobs, dask=dask, export=export)
    found = find_runs(options.paths, options.merge, options.export)
    shown = None
    if progress is not None:
        shown = Progress(sum(len(r.paths) for r in found), "", after_s=0, write=progress)
    runs = runs_of(options, found, progress=shown, keep_traces=False, patterns=patterns)
    errors = runs.errors()
    if errors:
        raise TraceError(errors[0] if len(errors) == 1 else f"{len(errors)} runs failed: {'; '.join(errors)}")
    return runs.overlap(options.step, options.rank)


def analyze_collectives(
    paths: str | Path | Iterable[str | Path], patterns: Patterns | None = None, merge: bool = False, **options: Any
) -> CollectivesView:
    """open_runs(paths, merge).collectives(**options): every run's collectives; a TraceError naming
    every run that failed."""
    runs = open_runs(paths, merge, patterns, keep_traces=False)
    if runs.errors():
        raise TraceError("; ".join(runs.errors()))
    return runs.collectives(**options)
