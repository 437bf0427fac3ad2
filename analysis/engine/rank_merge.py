"""Analyse the one-rank files of a run one file at a time and merge the small results, not the events.

A merged run's ranks are independent once their clocks are aligned: every metric is computed from
one rank's own work, so `analyze_file` (one export: load, `analyze_trace`, and the export's
session clock from TARGET_INFO_SESSION_START_TIME) can run in any process, and `combine` turns
the per-file results into exactly what `analyze_trace(load_trace(group))` gives for the whole
group: ranks numbered across files the same way, rows in rank order, the run's metadata and
shared-GPU flags from every file's ddp.meta marks and target info (ranks of two files may share a
GPU), the summary over every rank-step. No process ever holds more than one file's events.
`across_ranks` adds the per-step view of a merged run: a step is as slow as its slowest rank, and
its ranks' CPU step ranges, put on the first file's clock, show how far apart they started and
finished it.
"""
from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.engine.analyze import TRACE_KEYS, Analysis, analyze_trace, trace_summary
from analysis.engine.parallel import Outcome, Progress, run_tasks
from analysis.frames.run_info import shared_gpu_ranks
from analysis.frames.trace import NS_PER_MS, Trace
from analysis.measures.patterns import Patterns
from analysis.measures.phases import find_steps
from analysis.readers.kineto_json import is_kineto
from analysis.readers.load import load_trace
from analysis.readers.nsys_db import NsysExport


@dataclass(frozen=True)
class FileResult:
    """One export analysed alone. `ranks`: part-free rank table (rank as numbered inside this file,
    pid, device, meta_rank from its `ddp.meta` mark or None); `step_ranges`: pid, step, start, end
    on this file's clock; `clock_offset`: UTC ns minus trace-clock ns at its session start; `meta`
    ({pid: ddp.meta dict}) and `info` (the export's target info): what the run's metadata and the
    shared-GPU flags of the merged run are computed from."""

    path: str
    analysis: Analysis
    source: str
    nsys_version: str
    implementation: str | None  # from the file's ddp.meta marks, None when they do not say
    ranks: pd.DataFrame
    step_ranges: pd.DataFrame
    clock_offset: int
    meta: dict = field(default_factory=dict)
    info: dict = field(default_factory=dict)
    sha256: str = ""


@dataclass(frozen=True)
class Merged:
    """A group's analysis (as if loaded in one piece) and its per-step view across ranks."""

    analysis: Analysis
    across_ranks: pd.DataFrame


@dataclass(frozen=True)
class GroupOutcome:
    """A group of files: its merged result, or the one-line errors of the files that failed."""

    paths: tuple[Path, ...]
    merged: Merged | None
    errors: tuple[str, ...]
    failed: tuple[Path, ...] = ()
    files: tuple[FileResult, ...] = ()  # the files that were analysed


def session_offset(path: str | Path) -> int:
    """The export's UTC-minus-trace-clock offset from its session-start metadata (no events read)."""
    ex = NsysExport(Path(path))
    try:
        return ex.clock_offset()
    finally:
        ex.conn.close()


def analyze_file(path: str | Path, patterns: Patterns | None = None, skip_steps: int = 0) -> FileResult:
    """Load and analyse one export; what `combine` needs to merge it with the run's other files."""
    trace = load_trace(path, patterns)
    analysis = analyze_trace(trace, patterns, skip_steps)
    meta_rank = [trace.meta.get((int(part), int(pid)), {}).get("rank")
                 for part, pid in zip(trace.ranks["part"], trace.ranks["pid"], strict=True)]
    ranks = trace.ranks[["rank", "pid", "device"]].assign(meta_rank=pd.Series(meta_rank, dtype=object))
    steps = find_steps(trace.nvtx, patterns or Patterns())[["pid", "step", "start", "end"]]
    implementation = next((str(m["implementation"]) for m in trace.meta.values() if m.get("implementation")), None)
    # a torch.profiler file has no nsys session metadata; one file alone needs no clock shift
    clock_offset = 0 if is_kineto(Path(path)) else session_offset(path)
    return FileResult(str(path), analysis, trace.source, trace.nsys_version, implementation, ranks, steps,
                      clock_offset, {pid: m for (_, pid), m in trace.meta.items()}, trace.info.get(0, {}))


def _global_ranks(results: Sequence[FileResult], parts: Sequence[int]) -> pd.DataFrame:
    """part, pid, device, local rank -> rank across the files, numbered as `load_trace` numbers a merge:
    from `ddp.meta` when every rank has a distinct integer one, else by (device, file, pid)."""
    ranks = pd.concat([results[i].ranks.assign(part=i) for i in parts], ignore_index=True)
    ranks = ranks.sort_values(["device", "part", "pid"]).reset_index(drop=True)
    meta = ranks["meta_rank"].tolist()
    usable = all(isinstance(m, int) and not isinstance(m, bool) for m in meta) and len(set(meta)) == len(meta)
    return ranks.assign(global_rank=np.array(meta if usable else range(len(ranks)), dtype=np.int64))


def _renumbered(frame: pd.DataFrame, part: int, ranks: pd.DataFrame) -> pd.DataFrame:
    """A per-rank frame of file `part` with its ranks renumbered across files (and a part column)."""
    mine = ranks.loc[ranks["part"] == part, ["rank", "pid", "device", "global_rank"]]
    found = frame[["rank", "pid", "device"]].merge(mine, on=["rank", "pid", "device"], how="left")  # keeps row order
    return frame.assign(rank=found["global_rank"].to_numpy(dtype=np.int64), part=part)


def _keyed(frame: pd.DataFrame, keys: dict) -> pd.DataFrame:
    """The frame with its trace keys replaced by the group's, in front as `analyze_trace` puts them."""
    frame = frame.drop(columns=[k for k in TRACE_KEYS if k in frame]).reset_index(drop=True)
    for i, (k, v) in enumerate(keys.items()):
        frame.insert(i, k, v)
    return frame


def combine(paths: Sequence[str | Path], results: Sequence[FileResult]) -> Merged:
    """The per-file results of one run's files (in path order) as one merged analysis."""
    source = "gpu" if any(r.source == "gpu" for r in results) else "nvtx"
    kept = [i for i, r in enumerate(results) if r.source == source]  # a merge counts ranks with GPU work only
    ranks = _global_ranks(results, kept)
    run = _run_of(paths, results, source, ranks)
    shared = shared_gpu_ranks(run)  # ranks of different files can share a GPU
    keys = {"path": run.path, "implementation": run.implementation, "source": source, "nsys_version": run.nsys_version}
    frames = {}
    for f in fields(Analysis):
        if f.name == "summary":
            continue
        parts = [_renumbered(getattr(results[i].analysis, f.name), i, ranks) for i in kept]
        merged = pd.concat(parts, ignore_index=True).sort_values("rank", kind="stable")
        if "shared_gpu" in merged:
            merged["shared_gpu"] = merged["rank"].isin(shared).to_numpy()
        frames[f.name] = _keyed(merged, keys)
    offsets = [r.clock_offset for r in results]
    spread = across_ranks(frames["steps"], {i: results[i].step_ranges for i in kept},
                          {i: offsets[i] - offsets[0] for i in kept})
    frames = {name: frame.drop(columns="part") for name, frame in frames.items()}
    return Merged(Analysis(**frames, summary=trace_summary(run, frames["steps"])), spread)


def _run_of(paths: Sequence[str | Path], results: Sequence[FileResult], source: str, ranks: pd.DataFrame) -> Trace:
    """The merged run as a Trace without events: its keys, ranks (numbered across files), every file's
    ddp.meta marks and target info, as `load_trace` would give them; enough for run_info."""
    implementation = next((r.implementation for r in results if r.implementation), Path(paths[0]).stem)
    ranks = ranks.assign(rank=ranks["global_rank"], implementation=implementation)[
        ["rank", "part", "pid", "device", "implementation"]].sort_values("rank").reset_index(drop=True)
    return Trace(path=", ".join(str(p) for p in paths), nsys_version=results[0].nsys_version, source=source,
                 gpu_ops=pd.DataFrame(), nvtx=pd.DataFrame(), ranks=ranks,
                 meta={(i, pid): m for i, r in enumerate(results) for pid, m in r.meta.items()},
                 implementation=implementation, info={i: r.info for i, r in enumerate(results)})


ACROSS_COLUMNS = ["path", "step", "ranks", "step_ms", "slowest_rank", "mean_step_ms", "start_skew_ms",
                  "end_skew_ms", "exposed_comm_ms"]


def across_ranks(steps: pd.DataFrame, step_ranges: dict[int, pd.DataFrame], shifts: dict[int, int]) -> pd.DataFrame:
    """One row per step number over the ranks that have it: step_ms of the slowest rank (the step is
    as slow as it), that rank, the mean; start/end skew: latest minus earliest start/end of the
    ranks' CPU step ranges (NVTX) on the first file's clock; the largest exposed_comm_ms. `step_ranges` and
    `shifts` (ns onto that clock) are keyed by the rows' part (file index)."""
    rows = steps[steps["step"].notna()]
    if rows.empty:
        return pd.DataFrame(columns=ACROSS_COLUMNS)
    at = pd.concat([pd.DataFrame({"part": i, "pid": r["pid"], "step": r["step"], "range_start": r["start"] + shifts[i],
                                  "range_end": r["end"] + shifts[i]}) for i, r in step_ranges.items()],
                   ignore_index=True)
    at = at.drop_duplicates(["part", "pid", "step"])  # a step number used twice: its first range
    rows = rows.assign(step=rows["step"].astype(np.int64)).merge(at, on=["part", "pid", "step"], how="left")
    by = rows.groupby(["path", "step"], sort=False)
    slowest = rows.loc[by["step_ms"].idxmax(), ["path", "step", "rank"]]
    out = by.agg(ranks=("rank", "nunique"), step_ms=("step_ms", "max"), mean_step_ms=("step_ms", "mean"),
                 first_start=("range_start", "min"), last_start=("range_start", "max"),
                 first_end=("range_end", "min"), last_end=("range_end", "max"),
                 exposed_comm_ms=("exposed_comm_ms", "max")).reset_index()
    out = out.merge(slowest.rename(columns={"rank": "slowest_rank"}), on=["path", "step"])
    out["start_skew_ms"] = (out["last_start"] - out["first_start"]) / NS_PER_MS
    out["end_skew_ms"] = (out["last_end"] - out["first_end"]) / NS_PER_MS
    return out.sort_values(["step"], kind="stable")[ACROSS_COLUMNS].reset_index(drop=True)


def analyze_whole(paths: Sequence[str | Path], patterns: Patterns | None = None, skip_steps: int = 0) -> Merged:
    """A run's per-rank files loaded together (one process holds them all): the analysis' cross-rank
    figures (the collectives' wait/transfer split, metrics.SPLIT_METRICS) need every rank's calls,
    which `combine` does not merge yet."""
    trace = load_trace([Path(p) for p in paths], patterns)
    analysis = analyze_trace(trace, patterns, skip_steps)
    steps = analysis.steps.merge(trace.ranks[["rank", "part"]], on="rank", how="left")
    ranges = find_steps(trace.nvtx, patterns or Patterns())
    parts = {int(p): frame for p, frame in ranges.groupby("part")}
    return Merged(analysis, across_ranks(steps, parts, dict.fromkeys(parts, 0)))  # one clock already


def analyze_groups(groups: Sequence[Sequence[Path]], patterns: Patterns | None = None, skip_steps: int = 0,
                   jobs: int = 1, dask: str | None = None, progress: Progress | None = None,
                   task: Callable | None = None) -> list[GroupOutcome]:
    """Every file of every group as its own task (serial, process pool or Dask), then each group
    combined; a group with a failed file gets that file's error and no result. `task(path)` replaces
    `analyze_file` (it must return a FileResult)."""
    task = task or partial(analyze_file, patterns=patterns, skip_steps=skip_steps)
    if any(len(g) > 1 for g in groups):  # merged runs: see analyze_whole
        return _analyze_whole_groups(groups, patterns, skip_steps, jobs, dask, progress)
    files = [Path(p) for group in groups for p in group]
    opened = [p.resolve() for p in files] if dask else files  # Dask workers may start elsewhere
    outcomes = run_tasks(task, opened, jobs=jobs, dask=dask, progress=progress)
    out, at = [], 0
    for group in groups:
        mine: list[Outcome] = outcomes[at:at + len(group)]
        at += len(group)
        errors = tuple(o.error for o in mine if o.error is not None)
        failed = tuple(Path(p) for p, o in zip(group, mine, strict=True) if not o.ok)
        merged = None if errors else combine(list(group), [o.value for o in mine])
        analysed = tuple(o.value for o in mine if o.ok)
        out.append(GroupOutcome(tuple(Path(p) for p in group), merged, errors, failed, analysed))
    return out


def concat_analyses(analyses: Sequence[Analysis]) -> Analysis:
    """Several analyses as one, rows in the given order."""
    return Analysis(**{f.name: pd.concat([getattr(a, f.name) for a in analyses], ignore_index=True)
                       for f in fields(Analysis)})


def _analyze_whole_groups(groups: Sequence[Sequence[Path]], patterns: Patterns | None, skip_steps: int, jobs: int,
                          dask: str | None, progress: Progress | None) -> list[GroupOutcome]:
    """One task per group (analyze_whole); a bad file fails its group with the loader's one-line error."""
    items = [tuple(Path(p).resolve() if dask else Path(p) for p in g) for g in groups]
    outcomes = run_tasks(partial(analyze_whole, patterns=patterns, skip_steps=skip_steps), items, jobs=jobs,
                         dask=dask, progress=progress)
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
            merged = Merged(Analysis(**{f.name: getattr(merged.analysis, f.name).assign(path=label)
                                        for f in fields(Analysis)}), merged.across_ranks.assign(path=label))
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
