"""The Python API's entry functions: `open_runs(paths) -> OpenRuns` (session.py), `analyze`,
`analyze_collectives`, and `runs_of`, which builds the OpenRuns for them and for `cli.open_from_args`.

The options come either as an AnalysisOptions (analysis/options.py, as the CLIs take them) or as
keywords; each call turns them into one AnalysisOptions and opens the runs it names.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from analysis.collectives.collectives_view import CollectivesView
from analysis.errors import TraceError
from analysis.options import AnalysisOptions
from analysis.overlap.analyze import Analysis
from analysis.parallel.parallel import Progress
from analysis.run.run_files import RunFiles, find_runs
from analysis.session import OpenRuns
from analysis.trace.patterns import Patterns

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
    cache: bool | None = None,
    collectives: bool = True,
) -> OpenRuns:
    """The OpenRuns the options name: their runs (`found`: run_files.find_runs of their paths, when the caller
    has them), patterns (`patterns` instead when given), skip_steps, dask and `jobs` (else the options',
    else 1); the load cache off when the options say no_cache, else as `cache` says; collectives=False: no
    collectives view will be asked for (OpenRuns)."""
    found = found if found is not None else find_runs(options.paths, options.merge, options.export)
    chosen = jobs or options.jobs or 1
    patterns = patterns or options.patterns
    cache = False if options.no_cache else cache
    return OpenRuns(
        found, patterns, options.skip_steps, chosen, options.dask, progress, keep_traces, task, cache, collectives
    )


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
    cache: bool | None = None,
) -> OpenRuns:
    """The runs the paths hold (run_files.find_runs), ready to be asked for overlap, collectives and
    timelines; nothing is read until asked. The options as the CLIs take them: an AnalysisOptions
    (analysis/options.py) in place of `paths`, or the keywords. jobs/dask: analyse file by file (module
    docstring); `task(path)`: the per-file task instead of file_task.analyze_file (it returns a FileResult).
    cache=False (or the options' no_cache): the loads neither read nor write the load cache beside the
    traces (cache/loads.py); None: on unless ANALYSIS_NO_CACHE is set."""
    options = _options(paths, merge, patterns, skip_steps, jobs, dask=dask, export=export)
    return runs_of(options, progress=progress, keep_traces=keep_traces, task=task, patterns=patterns, cache=cache)


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
