"""Overlap metrics per rank and per step, exact to the nanosecond (union semantics throughout).

For each window (one step, or the whole capture):
  step_ms              NVTX step range duration (whole capture: span of the rank's activity)
  backward_ms          span of the backward pass's compute (GPU: first start to last end of its kernels)
  compute_ms           |union of compute|                 comm_ms   |union of communication|
  overlap_ms           |comm ∩ compute|                   backward_overlap_ms  |comm ∩ backward compute|
  exposed_comm_ms      comm_ms - overlap_ms               overlap_pct  overlap/comm x 100 (NaN: no comm)
  comm_kernels, compute_kernels, comm_copies, comm_ranges  counts
A step owns the work launched inside it (NVTX projection, see phases.py); its communication is
intersected with all of the rank's compute, so comm launched in step k and hidden behind step k+1's
compute still counts as overlapped.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from analysis import intervals as iv
from analysis.patterns import Patterns
from analysis.phases import KERNEL, MARK, PUSH_POP, codes, find_steps, launched_inside, ranges_named, step_of
from analysis.trace import Trace

NS_PER_MS = 1e6
METRICS = ["step_ms", "backward_ms", "compute_ms", "comm_ms", "overlap_ms", "backward_overlap_ms",
           "exposed_comm_ms", "overlap_pct", "comm_kernels", "compute_kernels", "comm_copies", "comm_ranges"]
COUNTS = ["comm_kernels", "compute_kernels", "comm_copies", "comm_ranges"]


@dataclass(frozen=True)
class Items:
    """Intervals with the window (0..n-1, or -1 for none) each belongs to."""

    window: np.ndarray
    start: np.ndarray
    end: np.ndarray

    def where(self, mask: np.ndarray) -> "Items":
        return Items(self.window[mask], self.start[mask], self.end[mask])

    def as_set(self) -> iv.Set:
        return iv.union(self.start, self.end)


@dataclass(frozen=True)
class RankActivity:
    """What one rank did, reduced to the intervals the metrics need."""

    comm: Items
    compute: Items
    backward: Items  # the compute that belongs to the backward pass
    comm_kernel: np.ndarray  # per comm item: is a kernel (vs copy or NVTX range)
    comm_copy: np.ndarray
    comm_range_windows: np.ndarray  # window of each comm NVTX range (counted only)
    span: tuple[int, int]
    compute_are_kernels: bool = True


def _per_window_length(items: Items, n: int) -> np.ndarray:
    keys, s, e = iv.keyed_union(items.window, items.start, items.end)
    return iv.sum_by_key(keys, e - s, n)


def _per_window_overlap(items: Items, other: iv.Set, n: int) -> np.ndarray:
    """Per window: |union of the window's items ∩ other| (other is one canonical set for the rank)."""
    keys, s, e = iv.keyed_union(items.window, items.start, items.end)
    return iv.sum_by_key(keys, iv.overlap_lengths(s, e, *other), n)


def _per_window_span(items: Items, n: int) -> np.ndarray:
    lo = np.full(n, np.iinfo(np.int64).max)
    hi = np.full(n, np.iinfo(np.int64).min)
    np.minimum.at(lo, items.window, items.start)
    np.maximum.at(hi, items.window, items.end)
    return np.where(hi > lo, hi - lo, 0)


def window_metrics(act: RankActivity, n: int, window_ns: np.ndarray) -> pd.DataFrame:
    """Metrics for windows 0..n-1 of one rank; window_ns gives each window's step duration."""
    inside = lambda items: items.where(items.window >= 0)
    comm, compute, backward = inside(act.comm), inside(act.compute), inside(act.backward)
    comm_ns = _per_window_length(comm, n)
    overlap_ns = _per_window_overlap(comm, act.compute.as_set(), n)
    frame = pd.DataFrame({
        "step_ms": np.asarray(window_ns) / NS_PER_MS,
        "backward_ms": _per_window_span(backward, n) / NS_PER_MS,
        "compute_ms": _per_window_length(compute, n) / NS_PER_MS,
        "comm_ms": comm_ns / NS_PER_MS,
        "overlap_ms": overlap_ns / NS_PER_MS,
        "backward_overlap_ms": _per_window_overlap(comm, act.backward.as_set(), n) / NS_PER_MS,
        "exposed_comm_ms": (comm_ns - overlap_ns) / NS_PER_MS,
        "overlap_pct": np.where(comm_ns > 0, 100.0 * overlap_ns / np.maximum(comm_ns, 1), np.nan),
    })
    count = lambda windows: np.bincount(windows[windows >= 0], minlength=n)[:n]
    frame["comm_kernels"] = count(act.comm.window[act.comm_kernel])
    frame["compute_kernels"] = count(act.compute.window) if act.compute_are_kernels else 0
    frame["comm_copies"] = count(act.comm.window[act.comm_copy])
    frame["comm_ranges"] = count(act.comm_range_windows)
    return frame


def _gpu_activity(trace: Trace, rows: np.ndarray, step: np.ndarray, backward_mask: np.ndarray,
                  comm_range_windows: np.ndarray) -> RankActivity:
    ops = trace.gpu_ops
    start, end = ops["start"].to_numpy()[rows], ops["end"].to_numpy()[rows]
    kind, is_comm = codes(ops["kind"])[rows], ops["is_comm"].to_numpy()[rows]
    every = Items(step, start, end)
    compute = (kind == KERNEL) & ~is_comm  # memcpy, memset and synchronisation are never compute
    return RankActivity(comm=every.where(is_comm), compute=every.where(compute),
                        backward=every.where(compute & backward_mask[rows]),
                        comm_kernel=(kind == KERNEL)[is_comm], comm_copy=(kind != KERNEL)[is_comm],
                        comm_range_windows=comm_range_windows,
                        span=(int(start.min()) if rows.size else 0, int(end.max()) if rows.size else 0))


def _nvtx_activity(ranges: dict[str, pd.DataFrame], step_of_start, span: tuple[int, int]) -> RankActivity:
    """CPU-only traces: comm = comm ranges in flight; compute = forward/backward/optimizer ranges minus
    blocking comm and gradient-sync waits."""
    def items(frame: pd.DataFrame) -> Items:
        s, e = frame["start"].to_numpy(), frame["end"].to_numpy()
        return Items(step_of_start(s), s, e)

    comm = items(ranges["comm"])
    blocking = ranges["comm"][codes(ranges["comm"]["kind"]) == PUSH_POP]
    waits = pd.concat([blocking, ranges["sync_wait"]])
    blocked = iv.union(waits["start"].to_numpy(), waits["end"].to_numpy())

    # a rank waiting in a blocking collective or for its gradients is not computing, even inside a
    # backward range
    compute = _cut(items(pd.concat([ranges[p] for p in ("forward", "backward", "optimizer")])), blocked)
    backward = _cut(items(ranges["backward"]), blocked)
    n = len(comm.start)
    return RankActivity(comm=comm, compute=compute, backward=backward, comm_kernel=np.zeros(n, bool),
                        comm_copy=np.zeros(n, bool), comm_range_windows=comm.window, span=span,
                        compute_are_kernels=False)


def _cut(items: Items, removed: iv.Set) -> Items:
    """Items with the removed set cut out of each of them (pieces keep their item's window)."""
    windows, starts, ends = [], [], []
    for w in np.unique(items.window):  # one iteration per window (step), not per range
        mine = items.window == w
        s, e = iv.subtract(items.start[mine], items.end[mine], *removed)
        windows.append(np.full(s.size, w)), starts.append(s), ends.append(e)
    if not windows:
        return items
    return Items(np.concatenate(windows), np.concatenate(starts), np.concatenate(ends))


def _ranges_by_phase(trace: Trace, patterns: Patterns) -> dict[str, pd.DataFrame]:
    return {phase: ranges_named(trace.nvtx, patterns.regex(field)) for phase, field in
            (("comm", "comm_range"), ("forward", "forward"), ("backward", "backward"), ("optimizer", "optimizer"),
             ("sync_wait", "sync_wait"))}


def _of_process(frame: pd.DataFrame, part: int, pid: int) -> pd.DataFrame:
    return frame[(frame["part"].to_numpy() == part) & (frame["pid"].to_numpy() == pid)]


def _rank_frames(trace: Trace, rank: pd.Series, activity_for, steps: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(per-step rows, total row) for one rank; activity_for(window_of) builds its RankActivity."""
    mine = _of_process(steps, rank["part"], rank["pid"]).sort_values("start")
    indexed = mine.assign(step=np.arange(len(mine)))

    def window_of(t: np.ndarray) -> np.ndarray:
        return step_of(indexed, np.full(len(t), rank["part"]), np.full(len(t), rank["pid"]), t)

    total_act = activity_for(lambda t: np.zeros(len(t), dtype=np.int64))
    total = window_metrics(total_act, 1, np.array([total_act.span[1] - total_act.span[0]]))
    if len(mine):
        per_step = window_metrics(activity_for(window_of), len(mine), (mine["end"] - mine["start"]).to_numpy())
        per_step.insert(0, "step", pd.array(mine["step"].to_numpy(), dtype="Int64"))
    else:  # no step ranges: the whole capture is the one window
        per_step = total.copy()
        per_step.insert(0, "step", pd.array([None], dtype="Int64"))
    return per_step, total


def measure_trace(trace: Trace, patterns: Patterns | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(per-step frame, per-rank total frame), each keyed by rank, pid, device."""
    patterns = patterns or Patterns()
    steps = find_steps(trace.nvtx, patterns)
    ranges = _ranges_by_phase(trace, patterns)
    ops = trace.gpu_ops
    backward_mask = launched_inside(ops, ranges["backward"]) if len(ops) else np.zeros(0, bool)
    groups = ops.groupby(["part", "pid", "device"], sort=False).indices if len(ops) else {}
    step_rows, total_rows = [], []
    for _, rank in trace.ranks.iterrows():  # one iteration per rank
        part, pid = int(rank["part"]), int(rank["pid"])
        comm_ranges = _of_process(ranges["comm"], part, pid)
        if trace.source == "gpu":
            rows = groups[(part, pid, int(rank["device"]))]
            launch = ops["launch_start"].to_numpy()[rows]
            activity_for = lambda window_of: _gpu_activity(
                trace, rows, window_of(launch), backward_mask, window_of(comm_ranges["start"].to_numpy()))
        else:
            mine = {phase: _of_process(frame, part, pid) for phase, frame in ranges.items()}
            own = _of_process(trace.nvtx, part, pid)
            own = own[codes(own["kind"]) != MARK]
            span = (int(own["start"].min()), int(own["end"].max())) if len(own) else (0, 0)
            activity_for = lambda window_of: _nvtx_activity(mine, window_of, span)
        per_step, total = _rank_frames(trace, rank, activity_for, steps)
        for frame, bucket in ((per_step, step_rows), (total, total_rows)):
            frame.insert(0, "device", int(rank["device"]))
            frame.insert(0, "pid", pid)
            frame.insert(0, "rank", int(rank["rank"]))
            bucket.append(frame)
    return pd.concat(step_rows, ignore_index=True), pd.concat(total_rows, ignore_index=True)


def summarise(per_step: pd.DataFrame) -> dict:
    """Metrics averaged over the given steps of all ranks; overlap_pct from the averaged times."""
    if len(per_step) == 0:
        return {"ranks": 0, "steps": 0, **{m: None for m in METRICS}}
    means = per_step[METRICS].mean(numeric_only=True)
    out = {m: float(means[m]) for m in METRICS if m != "overlap_pct"}
    out["overlap_pct"] = 100.0 * out["overlap_ms"] / out["comm_ms"] if out["comm_ms"] > 0 else None
    steps = int(per_step["step"].notna().sum()) if "step" in per_step else len(per_step)
    return {"ranks": int(per_step["rank"].nunique()), "steps": steps, **out}
