"""Runs analysed file by file (`--jobs N`, `--dask`): `analyze_groups(runs, task) -> [RunResult]`;
`RunResult` is what session.OpenRuns makes of a run either way (in one piece, or file by file).

Every file of every run is its own task (file_task.analyze_file, run by pool.run_tasks in processes
or on the cluster) and each run's file results are merged by the loader's rules (rank_merge.combine),
torch.profiler runs as nsys ones; no events leave a task, so a view that draws the events loads the run
once more in the calling process (session.OpenRuns). One bad file fails its run with a one-line error
and the other runs still finish.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from analysis.errors import TraceError
from analysis.overlap.analyze import Analysis
from analysis.parallel.file_task import FileResult
from analysis.parallel.pool import Progress, run_tasks
from analysis.parallel.rank_merge import combine
from analysis.parallel.tasks import Outcome
from analysis.run.run_files import RunFiles
from analysis.trace.readers.read import one_format


@dataclass(frozen=True)
class RunResult:
    """One run's analysis: the run, its Analysis, its per-step view across ranks, and (file by file) the
    files' results; `error`: the one-line error when it failed (then analysis is None); `call_rows`: the
    collectives view's rows of a run measured in one piece when events are needed."""

    run: RunFiles
    analysis: Analysis | None
    across_ranks: pd.DataFrame
    files: tuple[FileResult, ...] = ()
    error: str | None = None
    failed: tuple[Path, ...] = ()
    call_rows: tuple[pd.DataFrame, dict, pd.DataFrame, pd.DataFrame] | None = None  # collectives_view.RunRows


def analyze_groups(
    runs: Sequence[RunFiles],
    task: Callable,
    *,
    jobs: int = 1,
    dask: str | None = None,
    progress: Progress | None = None,
) -> list[RunResult]:
    """Every file of every run as its own task `task(path)` (serial, process pool or Dask), then each
    run's files combined into its RunResult; a run with a failed file gets that file's error and no
    analysis, as does one that mixes torch.profiler and nsys files (before any task) or whose
    torch.profiler files are not one job's."""
    mixed = [_format_error(r.paths) if len(r.paths) > 1 else None for r in runs]
    files = [p for run, error in zip(runs, mixed, strict=True) if error is None for p in run.paths]
    opened = [p.resolve() for p in files] if dask else files  # Dask workers may start elsewhere
    outcomes = run_tasks(task, opened, jobs=jobs, dask=dask, progress=progress) if files else []
    out, at = [], 0
    for run, error in zip(runs, mixed, strict=True):
        if error is not None:
            out.append(RunResult(run, None, pd.DataFrame(), error=error, failed=run.paths))
            continue
        mine: list[Outcome] = outcomes[at : at + len(run.paths)]
        at += len(run.paths)
        errors = [o.error for o in mine if o.error is not None]
        failed = tuple(p for p, o in zip(run.paths, mine, strict=True) if not o.ok)
        analysed = tuple(o.value for o in mine if o.ok)
        if not errors:
            try:
                merged = combine(list(run.paths), [o.value for o in mine])
                out.append(RunResult(run, merged.analysis, merged.across_ranks, analysed))
                continue
            except TraceError as e:  # torch.profiler files of different jobs: the files it names
                errors, failed = [str(e)], tuple(p for p in run.paths if str(p) in str(e)) or run.paths
        out.append(RunResult(run, None, pd.DataFrame(), analysed, "; ".join(errors), failed))
    return out


def _format_error(group: Sequence[Path]) -> str | None:
    """The loader's one-line error for a group mixing torch.profiler JSON and nsys exports, else None."""
    try:
        one_format([Path(p) for p in group])
    except TraceError as e:
        return str(e)
    return None
