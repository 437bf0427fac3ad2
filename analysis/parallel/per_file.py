"""Runs analysed file by file (`--jobs N`, `--dask`): `analyze_groups(groups) -> [GroupOutcome]`; and
`RunResult`, what session.OpenRuns makes of a run either way (in one piece, or from its GroupOutcome).

Every file of every run is its own task (file_task.analyze_file, run by parallel.run_tasks in processes
or on the cluster) and each run's file results are merged by the loader's rules (rank_merge.combine),
torch.profiler runs as nsys ones; no events leave a task, so a view that draws the events loads the run
once more in the calling process (session.OpenRuns). One bad file fails its run with a one-line error
and the other runs still finish.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import pandas as pd

from analysis.errors import TraceError
from analysis.overlap.analyze import Analysis
from analysis.parallel.file_task import FileResult, analyze_file
from analysis.parallel.parallel import Progress, run_tasks
from analysis.parallel.rank_merge import Merged, combine
from analysis.parallel.tasks import Outcome
from analysis.run.run_files import RunFiles
from analysis.trace.patterns import Patterns
from analysis.trace.readers.load import one_format


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
    *,
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
