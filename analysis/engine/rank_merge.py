"""Analyse the one-rank files of a run one file at a time and merge the small results, not the events.

A merged run's ranks are independent once their clocks are aligned: every metric is computed from
one rank's own work, so `analyze_file` (one export: load, `analyze_trace`, and the export's
session clock from TARGET_INFO_SESSION_START_TIME) can run in any process, and `combine` turns
the per-file results into exactly what `analyze_trace(load_trace(group))` gives for the whole
group: ranks numbered across files the same way, rows in rank order, the run's metadata and
shared-GPU flags from every file's ddp.meta marks and target info (ranks of two files may share a
GPU), the summary over every rank-step. No process ever holds more than one file's events.
The collectives' wait/transfer split (metrics.SPLIT_METRICS) pairs every rank's calls: each file
also returns its collective calls (one row per call, and each rank's compute only where it lies
under that rank's calls: all that the exposed parts look at), and `combine` shifts them onto the
first file's clock and pairs them with the one-piece code (collective_rows.rows_of_calls).
torch.profiler JSON runs are merged in one task (`analyze_whole`): the loader checks their files
are one job's, and takes their clocks from the JSON.
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
from analysis.measures import intervals as iv
from analysis.measures.collective_calls import Calls, find_calls
from analysis.measures.collective_rows import rows_of_calls, with_comm_split
from analysis.measures.metrics import SPLIT_METRICS
from analysis.measures.pairing import world_size
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
    shared-GPU flags of the merged run are computed from; `calls`: the file's collective calls on
    its own clock, compute cut to the calls (`calls_to_ship`), for the wait/transfer split."""

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
    calls: Calls | None = None


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
    """Load and analyse one export; what `combine` needs to merge it with the run's other files. A
    torch.profiler file's clock offset is 0: it is combined only with itself (see analyze_groups)."""
    trace = load_trace(path, patterns)
    calls = find_calls(trace, patterns)
    analysis = analyze_trace(trace, patterns, skip_steps, calls)
    meta_rank = [
        trace.meta.get((int(part), int(pid)), {}).get("rank")
        for part, pid in zip(trace.ranks["part"], trace.ranks["pid"], strict=True)
    ]
    ranks = trace.ranks[["rank", "pid", "device"]].assign(meta_rank=pd.Series(meta_rank, dtype=object))
    steps = find_steps(trace.nvtx, patterns or Patterns())[["pid", "step", "start", "end"]]
    implementation = next((str(m["implementation"]) for m in trace.meta.values() if m.get("implementation")), None)
    offset = 0 if is_kineto(Path(path)) else session_offset(path)
    return FileResult(
        str(path),
        analysis,
        trace.source,
        trace.nsys_version,
        implementation,
        ranks,
        steps,
        offset,
        {pid: m for (_, pid), m in trace.meta.items()},
        trace.info.get(0, {}),
        calls=calls_to_ship(calls),
    )


TEXT_CALL_COLUMNS = ["op", "tag", "phase", "kernel"]  # few distinct values: shipped as categoricals


def calls_to_ship(calls: Calls) -> Calls:
    """The calls with text columns as categoricals and each rank's compute cut to the union of that
    rank's calls: `pairing.exposure` only measures compute inside a call, so the cut set gives the
    same figures and stays small (10,000 calls of a 1M-kernel file: 1.7 MB pickled, 2.6 MB as found)."""
    frame = calls.frame.astype(dict.fromkeys(TEXT_CALL_COLUMNS, "category"))
    rows = frame.groupby("rank", sort=False).indices
    none = np.zeros(0, dtype=np.int64)
    compute = {}
    for rank, (s, e) in calls.compute.items():  # one iteration per rank
        mine = rows.get(rank, none)
        spans = iv.union(frame["start_ns"].to_numpy()[mine], frame["end_ns"].to_numpy()[mine])
        compute[rank] = iv.intersect(s, e, *spans)
    return Calls(frame, calls.source, compute)


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
    frames: dict[str, pd.DataFrame] = {}
    for f in fields(Analysis):
        if f.name == "summary":
            continue
        parts = [_renumbered(getattr(results[i].analysis, f.name), i, ranks) for i in kept]
        merged = pd.concat(parts, ignore_index=True).sort_values("rank", kind="stable")
        if "shared_gpu" in merged:
            merged["shared_gpu"] = merged["rank"].isin(shared).to_numpy()
        frames[f.name] = _keyed(merged, keys)
    offsets = [r.clock_offset for r in results]
    if len(results) > 1:  # one file's own split pairs all its ranks' calls already
        rows = _call_rows(run, results, kept, ranks)
        frames["steps"], frames["totals"] = with_comm_split(
            frames["steps"].drop(columns=SPLIT_METRICS), frames["totals"].drop(columns=SPLIT_METRICS), rows
        )
    spread = across_ranks(
        frames["steps"], {i: results[i].step_ranges for i in kept}, {i: offsets[i] - offsets[0] for i in kept}
    )
    frames = {name: frame.drop(columns="part") for name, frame in frames.items()}
    return Merged(Analysis(**frames, summary=trace_summary(run, frames["steps"])), spread)


def merged_call_rows(paths: Sequence[str | Path], results: Sequence[FileResult]) -> pd.DataFrame:
    """The collectives view's rows (collective_rows.ROW_COLUMNS) of a run from its files' results:
    those of `call_rows(load_trace(paths))`."""
    source = "gpu" if any(r.source == "gpu" for r in results) else "nvtx"
    kept = [i for i, r in enumerate(results) if r.source == source]
    ranks = _global_ranks(results, kept)
    return _call_rows(_run_of(paths, results, source, ranks), results, kept, ranks)


def _call_rows(run: Trace, results: Sequence[FileResult], kept: Sequence[int], ranks: pd.DataFrame) -> pd.DataFrame:
    calls = _merged_calls(results, kept, ranks, [r.clock_offset for r in results])
    return rows_of_calls(calls, world_size(run.meta, len(run.ranks)), run.path, run.implementation, len(run.ranks))[0]


def _merged_calls(
    results: Sequence[FileResult], kept: Sequence[int], ranks: pd.DataFrame, offsets: Sequence[int]
) -> Calls:
    """Every kept file's calls and compute as `find_calls` finds them in the one-piece load: ranks
    numbered across files, times shifted onto the first file's clock, kernel calls only when any file
    has them (a one-piece load takes the kernel source for the whole run when any rank has them)."""
    kept_calls = {i: c for i in kept if (c := results[i].calls) is not None}
    if len(kept_calls) < len(kept):
        raise ValueError("combine needs each file's collective calls (FileResult.calls)")
    source = "kernel" if any(c.source == "kernel" for c in kept_calls.values()) else "range"
    frames, compute = [], {}
    for i in kept:
        calls = kept_calls[i]
        shift = offsets[i] - offsets[0]
        if calls.source == source:
            frame = _renumbered(calls.frame, i, ranks)
            frames.append(frame.assign(**{c: frame[c] + shift for c in ("issue_ns", "start_ns", "end_ns")}))
        mine = ranks[ranks["part"] == i]
        for local, rank in zip(mine["rank"], mine["global_rank"], strict=True):  # one iteration per rank
            s, e = calls.compute.get(int(local), (iv.EMPTY, iv.EMPTY))
            compute[int(rank)] = (s + shift, e + shift)
    frame = pd.concat(frames, ignore_index=True).astype(dict.fromkeys(TEXT_CALL_COLUMNS, str))  # find_calls' dtype
    frame = frame.sort_values(["rank", "start_ns"], kind="stable").reset_index(drop=True)
    return Calls(frame, source, compute)


def _run_of(paths: Sequence[str | Path], results: Sequence[FileResult], source: str, ranks: pd.DataFrame) -> Trace:
    """The merged run as a Trace without events: its keys, ranks (numbered across files), every file's
    ddp.meta marks and target info, as `load_trace` would give them; enough for run_info."""
    implementation = next((r.implementation for r in results if r.implementation), Path(paths[0]).stem)
    ranks = (
        ranks.assign(rank=ranks["global_rank"], implementation=implementation)[
            ["rank", "part", "pid", "device", "implementation"]
        ]
        .sort_values("rank")
        .reset_index(drop=True)
    )
    return Trace(
        path=", ".join(str(p) for p in paths),
        nsys_version=results[0].nsys_version,
        source=source,
        gpu_ops=pd.DataFrame(),
        nvtx=pd.DataFrame(),
        ranks=ranks,
        meta={(i, pid): m for i, r in enumerate(results) for pid, m in r.meta.items()},
        implementation=implementation,
        info={i: r.info for i, r in enumerate(results)},
    )


ACROSS_COLUMNS = [
    "path",
    "step",
    "ranks",
    "step_ms",
    "slowest_rank",
    "mean_step_ms",
    "start_skew_ms",
    "end_skew_ms",
    "exposed_comm_ms",
]


def across_ranks(steps: pd.DataFrame, step_ranges: dict[int, pd.DataFrame], shifts: dict[int, int]) -> pd.DataFrame:
    """One row per step number over the ranks that have it: step_ms of the slowest rank (the step is
    as slow as it), that rank, the mean; start/end skew: latest minus earliest start/end of the
    ranks' CPU step ranges (NVTX) on the first file's clock; the largest exposed_comm_ms. `step_ranges` and
    `shifts` (ns onto that clock) are keyed by the rows' part (file index)."""
    rows = steps[steps["step"].notna()]
    if rows.empty:
        return pd.DataFrame(columns=ACROSS_COLUMNS)
    at = pd.concat(
        [
            pd.DataFrame(
                {
                    "part": i,
                    "pid": r["pid"],
                    "step": r["step"],
                    "range_start": r["start"] + shifts[i],
                    "range_end": r["end"] + shifts[i],
                }
            )
            for i, r in step_ranges.items()
        ],
        ignore_index=True,
    )
    at = at.drop_duplicates(["part", "pid", "step"])  # a step number used twice: its first range
    rows = rows.assign(step=rows["step"].astype(np.int64)).merge(at, on=["part", "pid", "step"], how="left")
    by = rows.groupby(["path", "step"], sort=False)
    slowest = rows.loc[by["step_ms"].idxmax(), ["path", "step", "rank"]]
    out = by.agg(
        ranks=("rank", "nunique"),
        step_ms=("step_ms", "max"),
        mean_step_ms=("step_ms", "mean"),
        first_start=("range_start", "min"),
        last_start=("range_start", "max"),
        first_end=("range_end", "min"),
        last_end=("range_end", "max"),
        exposed_comm_ms=("exposed_comm_ms", "max"),
    ).reset_index()
    out = out.merge(slowest.rename(columns={"rank": "slowest_rank"}), on=["path", "step"])
    out["start_skew_ms"] = (out["last_start"] - out["first_start"]) / NS_PER_MS
    out["end_skew_ms"] = (out["last_end"] - out["first_end"]) / NS_PER_MS
    return out.sort_values(["step"], kind="stable")[ACROSS_COLUMNS].reset_index(drop=True)


def analyze_whole(paths: Sequence[str | Path], patterns: Patterns | None = None, skip_steps: int = 0) -> Merged:
    """A run's per-rank files loaded together in one process (torch.profiler JSON runs: see the module
    docstring)."""
    trace = load_trace([Path(p) for p in paths], patterns)
    analysis = analyze_trace(trace, patterns, skip_steps)
    steps = analysis.steps.merge(trace.ranks[["rank", "part"]], on="rank", how="left")
    ranges = find_steps(trace.nvtx, patterns or Patterns())
    parts = {int(p): frame for p, frame in ranges.groupby("part")}
    return Merged(analysis, across_ranks(steps, parts, dict.fromkeys(parts, 0)))  # one clock already


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
