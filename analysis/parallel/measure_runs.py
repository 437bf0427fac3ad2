"""Every run's RunResult, one interface over serial, `--jobs N` and Dask: `measure_runs(runs, load, ...)`.

Serial (jobs=1, no Dask address): each run is loaded in one piece in this process by `load(i)` (the
OpenRuns' LoadedRun, kept there for the collectives view, the timeline and the report, so a run is
read once) and analysed from that object. With jobs > 1 or Dask: every file of every run is its own
task (file_task.analyze_file, run by parallel.run_tasks in processes or on the cluster) and each
run's file results are merged by the loader's rules (rank_merge.combine), torch.profiler runs as
nsys ones; no events leave a task, so a view that draws the events loads the run once more here.
Either way one bad file fails its run with a one-line error and the other runs still finish.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import pandas as pd

from analysis.collectives.collective_rows import call_rows
from analysis.collectives.collectives_view import run_call_rows
from analysis.errors import TraceError
from analysis.measure.loaded_run import LoadedRun
from analysis.overlap.analyze import Analysis, analyze_trace
from analysis.parallel.file_task import FileResult, analyze_file
from analysis.parallel.parallel import Progress, run_tasks
from analysis.parallel.rank_merge import Merged, across_ranks, combine
from analysis.parallel.tasks import Outcome
from analysis.run.run_files import RunFiles
from analysis.trace.patterns import Patterns
from analysis.trace.readers.load import one_format


@dataclass(frozen=True)
class RunResult:
    """One run's analysis: the run, its Analysis, its per-step view across ranks, and (per-file
    path) the files' results; `error`: the one-line error when it failed (then analysis is None)."""

    run: RunFiles
    analysis: Analysis | None
    across_ranks: pd.DataFrame
    files: tuple[FileResult, ...] = ()
    error: str | None = None
    failed: tuple[Path, ...] = ()
    call_rows: tuple[pd.DataFrame, dict, pd.DataFrame] | None = None


def measure_runs(
    runs: Sequence[RunFiles],
    load: Callable[[int], LoadedRun],
    patterns: Patterns,
    skip_steps: int = 0,
    jobs: int = 1,
    dask: str | None = None,
    progress: Progress | None = None,
    task: Callable | None = None,
    cache: bool | None = None,
    collectives: bool = True,
) -> list[RunResult]:
    """One RunResult per run, in order: serial in one piece (`load(i)`: run i loaded and measured) when
    jobs == 1 and no `dask` address, else file by file (module docstring); a failed run carries its error.
    `task(path)` replaces file_task.analyze_file (it returns a FileResult); `cache`: the per-file loads'
    load-cache setting (runs.load_trace); collectives=False: no collectives view will be asked for, so a run
    in one piece keeps no collective rows (their gather rows and in-time facts are not made)."""
    if jobs <= 1 and dask is None:
        return [
            _one_piece(run, partial(load, i), patterns, skip_steps, progress, collectives) for i, run in enumerate(runs)
        ]
    if task is None and cache is not None:  # the per-file loads keep to the cache setting
        task = partial(analyze_file, patterns=patterns, skip_steps=skip_steps, cache=cache)
    done = analyze_groups([list(r.paths) for r in runs], patterns, skip_steps, jobs, dask, progress, task)
    out = []
    for run, g in zip(runs, done, strict=True):
        if g.merged is None:
            out.append(RunResult(run, None, pd.DataFrame(), g.files, "; ".join(g.errors), g.failed))
        else:
            out.append(RunResult(run, g.merged.analysis, g.merged.across_ranks, g.files))
    return out


def _one_piece(
    run: RunFiles,
    load: Callable[[], LoadedRun],
    patterns: Patterns,
    skip_steps: int,
    progress: Progress | None,
    collectives: bool = True,
) -> RunResult:
    """A run loaded in one piece and analysed from its LoadedRun (its collective rows kept for the view,
    unless `collectives` is False: then only the plain call rows the overlap figures need are made)."""
    try:
        loaded = load()
        rows = run_call_rows(loaded) if collectives else None
        plain = rows[0] if rows is not None else call_rows(loaded.trace, loaded.patterns, loaded.works, loaded.calls)[0]
        analysis = analyze_trace(loaded.trace, patterns, skip_steps, loaded.calls, loaded.works, plain)
        spread = _across_ranks_of(loaded, analysis.steps)
    except TraceError as e:
        _tick(progress, run, str(e))
        return RunResult(run, None, pd.DataFrame(), error=str(e), failed=run.paths)
    _tick(progress, run, None)
    return RunResult(run, analysis, spread, call_rows=rows)


def _tick(progress: Progress | None, run: RunFiles, error: str | None) -> None:
    if progress is not None:
        for path in run.paths:
            progress.tick(Outcome(path, error=error))


def _across_ranks_of(run: LoadedRun, steps: pd.DataFrame) -> pd.DataFrame:
    """rank_merge.across_ranks of a run loaded in one piece (its parts share one clock already)."""
    trace = run.trace
    ranges = run.step_ranges[["part", "pid", "step", "start", "end"]]
    with_part = steps.merge(trace.ranks[["rank", "part"]], on="rank", how="left")
    parts = sorted(int(p) for p in trace.ranks["part"].unique())
    by_part = {p: ranges[ranges["part"] == p].drop(columns="part") for p in parts}
    return across_ranks(with_part, by_part, dict.fromkeys(parts, 0))


@dataclass(frozen=True)
class GroupOutcome:
    """A group of files: its merged result, or the one-line errors of the files that failed."""

    paths: tuple[Path, ...]
    merged: Merged | None
    errors: tuple[str, ...]
    failed: tuple[Path, ...] = ()
    files: tuple[FileResult, ...] = ()  # the files that were analysed


def analyze_groups(
    groups: Sequence[Sequence[Path]],
    patterns: Patterns | None = None,
    skip_steps: int = 0,
    jobs: int = 1,
    dask: str | None = None,
    progress: Progress | None = None,
    task: Callable | None = None,
) -> list[GroupOutcome]:
    """Every file of every group (one trace, or one run's per-rank files) as its own task (serial,
    process pool or Dask), then each group combined; a group with a failed file gets that file's
    error and no result, as does one that mixes torch.profiler and nsys files (before any task) or
    whose torch.profiler files are not one job's. `task(path)` replaces `analyze_file`."""
    task = task or partial(analyze_file, patterns=patterns, skip_steps=skip_steps)
    mixed = [_format_error(g) if len(g) > 1 else None for g in groups]
    files = [Path(p) for group, error in zip(groups, mixed, strict=True) if error is None for p in group]
    opened = [p.resolve() for p in files] if dask else files  # Dask workers may start elsewhere
    outcomes = run_tasks(task, opened, jobs=jobs, dask=dask, progress=progress) if files else []
    out, at = [], 0
    for group, error in zip(groups, mixed, strict=True):
        paths = tuple(Path(p) for p in group)
        if error is not None:
            out.append(GroupOutcome(paths, None, (error,), paths))
            continue
        mine: list[Outcome] = outcomes[at : at + len(group)]
        at += len(group)
        errors = tuple(o.error for o in mine if o.error is not None)
        failed = tuple(p for p, o in zip(paths, mine, strict=True) if not o.ok)
        merged = None
        if not errors:
            try:
                merged = combine(list(group), [o.value for o in mine])
            except TraceError as e:  # torch.profiler files of different jobs: the files it names
                errors, failed = (str(e),), tuple(p for p in paths if str(p) in str(e)) or paths
        analysed = tuple(o.value for o in mine if o.ok)
        out.append(GroupOutcome(paths, merged, errors, failed, analysed))
    return out


def _format_error(group: Sequence[Path]) -> str | None:
    """The loader's one-line error for a group mixing torch.profiler JSON and nsys exports, else None."""
    try:
        one_format([Path(p) for p in group])
    except TraceError as e:
        return str(e)
    return None
