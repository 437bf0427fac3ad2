"""The Python API's entry functions: `open_runs(paths, options) -> OpenRuns` (session.py), which every CLI
calls too (cli.open_from_args), and `analyze`, `analyze_collectives` on top of it.

The options are one AnalysisOptions (analysis/options.py, as the CLIs build them), or its fields as
keywords (`open_runs(paths, merge=True, skip_steps=1)`); what is not an option (progress, a per-file
task, whether the runs' events are needed) is keyword-only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from analysis.collectives.collectives_view import CollectivesView
from analysis.errors import TraceError
from analysis.options import AnalysisOptions
from analysis.overlap.analyze import Analysis
from analysis.parallel.pool import Progress
from analysis.run.run_files import RunFiles, find_runs
from analysis.session import OpenRuns
from analysis.trace.patterns import Patterns

if TYPE_CHECKING:
    from analysis.trace.readers.read import StartedRead

Paths = str | Path | Iterable[str | Path]


def options_of(paths: Paths | Sequence[RunFiles], options: AnalysisOptions | None, **fields: Any) -> AnalysisOptions:
    """The options of an API call: `options` or its fields given as keywords (then checked as the CLIs'
    are), with `paths` as their paths. Options given both ways are a TypeError."""
    if options is not None and fields:
        raise TypeError(f"options given both as AnalysisOptions and as keywords: {', '.join(fields)}")
    listed = _listed(paths)
    if options is None:
        return AnalysisOptions(listed, **fields)
    return replace(options, paths=listed)


def _listed(paths: Paths | Sequence[RunFiles]) -> list[str]:
    if isinstance(paths, (str, Path)):
        return [str(paths)]
    return [str(p) for item in paths for p in (item.paths if isinstance(item, RunFiles) else [item])]


def _found(paths: Paths | Sequence[RunFiles]) -> list[RunFiles]:
    """The runs given when `paths` are runs already found (RunFiles), else []."""
    given = [] if isinstance(paths, (str, Path)) else list(paths)
    runs = [r for r in given if isinstance(r, RunFiles)]
    return runs if given and len(runs) == len(given) else []


def open_runs(
    paths: Paths | Sequence[RunFiles],
    options: AnalysisOptions | None = None,
    *,
    patterns: Patterns | None = None,
    progress: Progress | None = None,
    task: Callable | None = None,
    keep_traces: bool = True,
    needs_events: bool = False,
    overlap_detail: bool = True,
    started: StartedRead | None = None,
    **fields: Any,
) -> OpenRuns:
    """The runs the paths hold (run_files.find_runs, by the options' merge and export; or the runs
    already found), ready to be asked for overlap, collectives, timelines and the report; nothing is
    read until asked. `options`: an AnalysisOptions, or `fields` its fields as keywords. `patterns`:
    in place of the options' (a Patterns may set more). session.OpenRuns documents the rest."""
    opts = options_of(paths, options, **fields)
    runs = _found(paths) or find_runs(opts.paths, opts.merge, opts.export)
    return OpenRuns(
        runs,
        opts,
        patterns=patterns,
        progress=progress,
        task=task,
        keep_traces=keep_traces,
        needs_events=needs_events,
        overlap_detail=overlap_detail,
        started=started,
    )


def analyze(
    paths: Paths,
    options: AnalysisOptions | None = None,
    *,
    patterns: Patterns | None = None,
    progress: Callable[[str], object] | None = None,
    **fields: Any,
) -> Analysis:
    """open_runs(paths, options).overlap(): every run's metrics (only the options' step and rank); a
    TraceError naming every run that failed. `progress`: called with a 'files done / total' line as
    files finish."""
    opts = options_of(paths, options, **fields)
    found = find_runs(opts.paths, opts.merge, opts.export)
    shown = None if progress is None else Progress(sum(len(r.paths) for r in found), "", after_s=0, write=progress)
    runs = open_runs(found, opts, patterns=patterns, progress=shown, keep_traces=False)
    errors = runs.errors()
    if errors:
        raise TraceError(errors[0] if len(errors) == 1 else f"{len(errors)} runs failed: {'; '.join(errors)}")
    return runs.overlap(opts.step, opts.rank)


def analyze_collectives(
    paths: Paths,
    options: AnalysisOptions | None = None,
    *,
    patterns: Patterns | None = None,
    rank: int | None = None,
    step: int | None = None,
    peak_busbw: float | None = None,
    **fields: Any,
) -> CollectivesView:
    """open_runs(paths, options).collectives(rank=, step=, peak_busbw=): every run's collectives; a
    TraceError naming every run that failed."""
    runs = open_runs(paths, options, patterns=patterns, keep_traces=False, needs_events=True, **fields)
    if runs.errors():
        raise TraceError("; ".join(runs.errors()))
    return runs.collectives(rank=rank, step=step, peak_busbw=peak_busbw)
