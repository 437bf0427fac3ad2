"""Analyse groups of trace files as tasks: `analyze_groups(groups, jobs=..., dask=...)`.

A group is one trace (one file) or one run's per-rank files (`--merge`, the report's
`<impl>.rank<N>` groups). Every file of every group is its own task (file_task.analyze_file), run
serially, in a process pool or on a Dask cluster (parallel.run_tasks); each group's results are
then merged (rank_merge.combine). A group with a torch.profiler file runs as one task
(rank_merge.analyze_whole). One bad file fails its group with a one-line error; the other groups
still finish (`report_failures` prints the errors).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from functools import partial
from pathlib import Path

import pandas as pd

from analysis.engine.analyze import Analysis
from analysis.engine.file_task import FileResult, analyze_file
from analysis.engine.parallel import Outcome, Progress, run_tasks
from analysis.engine.rank_merge import Merged, analyze_whole, combine
from analysis.measures.patterns import Patterns
from analysis.readers.kineto_json import is_kineto


@dataclass(frozen=True)
class GroupOutcome:
    """A group of files: its merged result, or the one-line errors of the files that failed."""

    paths: tuple[Path, ...]
    merged: Merged | None
    errors: tuple[str, ...]
    failed: tuple[Path, ...] = ()
    files: tuple[FileResult, ...] = ()  # the files that were analysed


def loaded_whole(group: Sequence[str | Path]) -> bool:
    """Whether a group is analysed in one task (`analyze_whole`): a merge with a torch.profiler file."""
    return len(group) > 1 and any(is_kineto(Path(p)) for p in group)


def analyze_groups(
    groups: Sequence[Sequence[Path]],
    patterns: Patterns | None = None,
    skip_steps: int = 0,
    jobs: int = 1,
    dask: str | None = None,
    progress: Progress | None = None,
    task: Callable | None = None,
) -> list[GroupOutcome]:
    """Every file of every group as its own task (serial, process pool or Dask), then each group
    combined; a group with a failed file gets that file's error and no result. `task(path)` replaces
    `analyze_file` (it must return a FileResult). Groups for which `loaded_whole` holds run as one
    task each, after the files."""
    task = task or partial(analyze_file, patterns=patterns, skip_steps=skip_steps)
    whole = [loaded_whole(g) for g in groups]
    by_file = [g for g, w in zip(groups, whole, strict=True) if not w]
    files = [Path(p) for group in by_file for p in group]
    opened = [p.resolve() for p in files] if dask else files  # Dask workers may start elsewhere
    outcomes = run_tasks(task, opened, jobs=jobs, dask=dask, progress=progress) if files else []
    together = iter(
        _analyze_whole_groups(
            [g for g, w in zip(groups, whole, strict=True) if w], patterns, skip_steps, jobs, dask, progress
        )
        if any(whole)
        else []
    )
    out, at = [], 0
    for group, w in zip(groups, whole, strict=True):
        if w:
            out.append(next(together))
            continue
        mine: list[Outcome] = outcomes[at : at + len(group)]
        at += len(group)
        errors = tuple(o.error for o in mine if o.error is not None)
        failed = tuple(Path(p) for p, o in zip(group, mine, strict=True) if not o.ok)
        merged = None if errors else combine(list(group), [o.value for o in mine])
        analysed = tuple(o.value for o in mine if o.ok)
        out.append(GroupOutcome(tuple(Path(p) for p in group), merged, errors, failed, analysed))
    return out


def concat_analyses(analyses: Sequence[Analysis]) -> Analysis:
    """Several analyses as one, rows in the given order."""
    return Analysis(
        **{f.name: pd.concat([getattr(a, f.name) for a in analyses], ignore_index=True) for f in fields(Analysis)}
    )


def _analyze_whole_groups(
    groups: Sequence[Sequence[Path]],
    patterns: Patterns | None,
    skip_steps: int,
    jobs: int,
    dask: str | None,
    progress: Progress | None,
) -> list[GroupOutcome]:
    """One task per group (analyze_whole); a bad file fails its group with the loader's one-line error."""
    items = [tuple(Path(p).resolve() if dask else Path(p) for p in g) for g in groups]
    outcomes = run_tasks(
        partial(analyze_whole, patterns=patterns, skip_steps=skip_steps), items, jobs=jobs, dask=dask, progress=progress
    )
    out = []
    for group, outcome in zip(groups, outcomes, strict=True):
        paths = tuple(Path(p) for p in group)
        if outcome.error is not None:
            failed = tuple(p for p in paths if str(p) in outcome.error or str(p.resolve()) in outcome.error) or paths
            out.append(GroupOutcome(paths, None, (outcome.error,), failed))
            continue
        merged = outcome.value
        if dask:  # the workers saw absolute paths: the group's keys use the paths as given
            label = ", ".join(str(p) for p in group)
            merged = Merged(
                Analysis(**{f.name: getattr(merged.analysis, f.name).assign(path=label) for f in fields(Analysis)}),
                merged.across_ranks.assign(path=label),
            )
        out.append(GroupOutcome(paths, merged, ()))
    return out


def report_failures(groups: Sequence[GroupOutcome]) -> list[str]:
    """Print each failed file's (or merged run's) one-line error, then, when there were several, a
    closing line naming every failed file; returns the failed files."""
    for g in groups:
        for error in g.errors:
            print(f"error: {error}", file=sys.stderr, flush=True)
    bad = [str(p) for g in groups for p in g.failed]
    if sum(len(g.errors) for g in groups) > 1:  # one error line already names its file(s)
        total = sum(len(g.paths) for g in groups)
        print(f"error: {len(bad)} of {total} files failed: {', '.join(bad)}", file=sys.stderr, flush=True)
    return bad
