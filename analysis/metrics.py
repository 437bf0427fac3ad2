"""Overlap metrics per rank and per step, exact to the nanosecond (union semantics throughout).

For each window (one step, see steps.py for its bounds; or the whole capture):
  step_ms              the step window's length (GPU ranks: start to next step's start; CPU-only
                       ranks: the NVTX step range); whole capture: span of the rank's activity
  backward_ms          span of the backward pass's compute (GPU: first start to last end of its kernels)
  compute_ms           |union of compute|                 comm_ms   |union of communication|
  comm_kernel_ms       |union of communication kernels|   comm_copy_ms  |union of communication copies|
  overlap_ms           |comm ∩ compute|                   backward_overlap_ms  |comm ∩ backward compute|
  exposed_comm_ms      comm_ms - overlap_ms               overlap_pct  overlap/comm x 100 (NaN: no comm)
  idle_ms              window length minus the time inside it when the rank computed or communicated
                       (whichever step launched that work)
  comm_kernels, compute_kernels, comm_copies, comm_ranges  counts (comm_ranges: each collective once)
  comm_wait_ms, comm_transfer_ms, exposed_comm_wait_ms, exposed_comm_transfer_ms  the step's collective
                       calls split into waiting for the last rank and transfer, and the parts of each
                       not under compute (analysis.collectives; added by overlap.analyze_trace)
A step owns the work launched inside it (NVTX projection, see phases.py and steps.py); its
communication is intersected with all of the rank's compute, so comm launched in step k and hidden
behind step k+1's compute still counts as overlapped.

Where each figure comes from (columns comm_source, compute_source):
  kernels/kernels  GPU ranks whose collectives run on the GPU: comm = communication kernels and copies.
  ranges/kernels   GPU ranks whose collectives run on the host (gloo with CUDA tensors: the GPU sees
                   only staging copies): comm = the comm NVTX ranges, compute = GPU compute kernels.
  ranges/ranges    CPU-only ranks: comm ranges, and forward/backward/optimizer ranges minus blocking
                   comm and gradient-sync waits.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import numpy as np
import pandas as pd

from analysis import intervals as iv
from analysis.patterns import Patterns
from analysis.phases import (
    KERNEL,
    MARK,
    MEMCPY,
    PUSH_POP,
    codes,
    counted_comm_ranges,
    find_steps,
    launched_inside,
    ranges_named,
)
from analysis.steps import step_windows, window_index
from analysis.trace import Trace

NS_PER_MS = 1e6
# added by overlap.analyze_trace from the collectives view (collective_rows.with_comm_split)
SPLIT_METRICS = ["comm_wait_ms", "comm_transfer_ms", "exposed_comm_wait_ms", "exposed_comm_transfer_ms"]
Windowing = Callable[[np.ndarray], np.ndarray]  # times -> index of their window (-1: in none)
METRICS = ["step_ms", "backward_ms", "compute_ms", "comm_ms", "comm_kernel_ms", "comm_copy_ms", "overlap_ms",
           "backward_overlap_ms", "exposed_comm_ms", "idle_ms", "overlap_pct", "comm_kernels", "compute_kernels",
           "comm_copies", "comm_ranges", *SPLIT_METRICS]
COUNTS = ["comm_kernels", "compute_kernels", "comm_copies", "comm_ranges"]
SOURCES = ["comm_source", "compute_source", "shared_gpu"]  # per rank: where the figures come from


@dataclass(frozen=True)
class Items:
    """Intervals with the window (0..n-1, or -1 for none) each belongs to."""

    window: np.ndarray
    start: np.ndarray
    end: np.ndarray

    def where(self, mask: np.ndarray) -> Items:
        return Items(self.window[mask], self.start[mask], self.end[mask])

    def as_set(self) -> iv.Set:
        return iv.union(self.start, self.end)

    def of_window(self, w: int) -> Items:
        return self.where(self.window == w)


@dataclass(frozen=True)
class RankActivity:
    """What one rank did, reduced to the intervals the metrics need."""

    comm: Items
    compute: Items
    backward: Items  # the compute that belongs to the backward pass
    comm_kernels: Items  # GPU communication kernels (empty on CPU-only ranks)
    comm_copies: Items  # GPU copies that are part of a collective
    comm_range_windows: np.ndarray  # window of each counted comm NVTX range (counted only)
    span: tuple[int, int]
    compute_are_kernels: bool = True


@dataclass(frozen=True)
class RankWork:
    """One rank's activity windowed by step (`steps`, windows from steps.step_windows) and over the
    whole capture (`whole`, window 0), with the sources of its figures."""

    rank: int
    part: int
    pid: int
    device: int
    windows: pd.DataFrame  # step, start, launch_end, end, work_end (last end of work launched in it)
    steps: RankActivity
    whole: RankActivity
    comm_source: str
    compute_source: str


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


def window_metrics(act: RankActivity, n: int, bounds: tuple[np.ndarray, np.ndarray]) -> pd.DataFrame:
    """Metrics for windows 0..n-1 of one rank; bounds: each window's (start, end) in ns."""
    inside = lambda items: items.where(items.window >= 0)
    comm, compute, backward = inside(act.comm), inside(act.compute), inside(act.backward)
    comm_ns = _per_window_length(comm, n)
    overlap_ns = _per_window_overlap(comm, act.compute.as_set(), n)
    lo, hi = (np.asarray(b, dtype=np.int64) for b in bounds)
    busy = iv.union(np.r_[act.compute.start, act.comm.start], np.r_[act.compute.end, act.comm.end])
    busy_ns = iv.covered_before(*busy, hi) - iv.covered_before(*busy, lo)
    gpu = np.nan if not act.compute_are_kernels else 1.0  # CPU-only ranks have no kernels or copies
    frame = pd.DataFrame({
        "step_ms": (hi - lo) / NS_PER_MS,
        "backward_ms": _per_window_span(backward, n) / NS_PER_MS,
        "compute_ms": _per_window_length(compute, n) / NS_PER_MS,
        "comm_ms": comm_ns / NS_PER_MS,
        "comm_kernel_ms": gpu * _per_window_length(inside(act.comm_kernels), n) / NS_PER_MS,
        "comm_copy_ms": gpu * _per_window_length(inside(act.comm_copies), n) / NS_PER_MS,
        "overlap_ms": overlap_ns / NS_PER_MS,
        "backward_overlap_ms": _per_window_overlap(comm, act.backward.as_set(), n) / NS_PER_MS,
        "exposed_comm_ms": (comm_ns - overlap_ns) / NS_PER_MS,
        "idle_ms": (hi - lo - busy_ns) / NS_PER_MS,
        "overlap_pct": np.where(comm_ns > 0, 100.0 * overlap_ns / np.maximum(comm_ns, 1), np.nan),
    })
    count = lambda windows: np.bincount(windows[windows >= 0], minlength=n)[:n]
    frame["comm_kernels"] = count(act.comm_kernels.window)
    frame["compute_kernels"] = count(act.compute.window) if act.compute_are_kernels else 0
    frame["comm_copies"] = count(act.comm_copies.window)
    frame["comm_ranges"] = count(act.comm_range_windows)
    return frame


def _gpu_activity(trace: Trace, rows: np.ndarray, window: np.ndarray, backward_mask: np.ndarray,
                  ranges: pd.DataFrame, range_window: np.ndarray, counted: np.ndarray,
                  host_side: bool) -> RankActivity:
    """A GPU rank: compute = its compute kernels; comm = its communication kernels and copies, or
    (host_side: collectives run on the CPU) its comm NVTX ranges."""
    ops = trace.gpu_ops
    start, end = ops["start"].to_numpy()[rows], ops["end"].to_numpy()[rows]
    kind, is_comm = codes(ops["kind"])[rows], ops["is_comm"].to_numpy()[rows]
    every = Items(window, start, end)
    compute = (kind == KERNEL) & ~is_comm  # memcpy, memset and synchronisation are never compute
    on_host = Items(range_window, ranges["start"].to_numpy(), ranges["end"].to_numpy())
    return RankActivity(comm=on_host if host_side else every.where(is_comm), compute=every.where(compute),
                        backward=every.where(compute & backward_mask[rows]),
                        comm_kernels=every.where(is_comm & (kind == KERNEL)),
                        comm_copies=every.where(is_comm & (kind == MEMCPY)),
                        comm_range_windows=range_window[counted],
                        span=(int(start.min()) if rows.size else 0, int(end.max()) if rows.size else 0))


def _gpu_builder(trace: Trace, rows: np.ndarray, backward_mask: np.ndarray, comm: pd.DataFrame, counted: np.ndarray,
                 host_side: bool) -> Callable[[Windowing], RankActivity]:
    """_gpu_activity of one rank, its kernels' launches and comm ranges windowed by the function given."""
    launch = trace.gpu_ops["launch_start"].to_numpy()[rows]
    return lambda w: _gpu_activity(trace, rows, w(launch), backward_mask, comm, w(comm["start"].to_numpy()),
                                   counted, host_side)


def _nvtx_activity(ranges: dict[str, pd.DataFrame], window_of: Windowing,
                   counted: np.ndarray, span: tuple[int, int]) -> RankActivity:
    """CPU-only traces: comm = comm ranges in flight; compute = forward/backward/optimizer ranges minus
    blocking comm and gradient-sync waits."""
    def items(frame: pd.DataFrame) -> Items:
        s, e = frame["start"].to_numpy(), frame["end"].to_numpy()
        return Items(window_of(s), s, e)

    comm = items(ranges["comm"])
    blocking = ranges["comm"][codes(ranges["comm"]["kind"]) == PUSH_POP]
    waits = pd.concat([blocking, ranges["sync_wait"]])
    blocked = iv.union(waits["start"].to_numpy(), waits["end"].to_numpy())

    # a rank waiting in a blocking collective or for its gradients is not computing, even inside a
    # backward range
    compute = _cut(items(pd.concat([ranges[p] for p in ("forward", "backward", "optimizer")])), blocked)
    backward = _cut(items(ranges["backward"]), blocked)
    none = comm.where(np.zeros(len(comm.start), bool))
    return RankActivity(comm=comm, compute=compute, backward=backward, comm_kernels=none, comm_copies=none,
                        comm_range_windows=comm.window[counted], span=span, compute_are_kernels=False)


def _cut(items: Items, removed: iv.Set) -> Items:
    """Items with the removed set cut out of each of them (pieces keep their item's window)."""
    windows: list[np.ndarray] = []
    starts: list[np.ndarray] = []
    ends: list[np.ndarray] = []
    for w in np.unique(items.window):  # one iteration per window (step), not per range
        mine = items.window == w
        s, e = iv.subtract(items.start[mine], items.end[mine], *removed)
        windows.append(np.full(s.size, w))
        starts.append(s)
        ends.append(e)
    if not windows:
        return items
    return Items(np.concatenate(windows), np.concatenate(starts), np.concatenate(ends))


def _ranges_by_phase(trace: Trace, patterns: Patterns) -> dict[str, pd.DataFrame]:
    return {phase: ranges_named(trace.nvtx, patterns.regex(field)) for phase, field in
            (("comm", "comm_range"), ("forward", "forward"), ("backward", "backward"), ("optimizer", "optimizer"),
             ("sync_wait", "sync_wait"))}


def _of_process(frame: pd.DataFrame, part: int, pid: int) -> pd.DataFrame:
    return frame[(frame["part"].to_numpy() == part) & (frame["pid"].to_numpy() == pid)]


def _work_end(windows: pd.DataFrame, launch: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Per window: the later of its end and the last end of the work launched in it."""
    out = windows["end"].to_numpy(np.int64).copy()
    w = window_index(windows, launch)
    np.maximum.at(out, w[w >= 0], end[w >= 0])
    return out


def is_host_side(trace: Trace, part: int, pid: int, comm_kernels: int, comm_ranges: int) -> bool:
    """Whether a GPU rank's collectives run on the host: `ddp.meta` says gloo, or it has comm ranges
    but no communication kernels."""
    backend = str(trace.meta.get((part, pid), {}).get("backend", "")).lower()
    return backend == "gloo" or (comm_kernels == 0 and comm_ranges > 0)


def rank_work(trace: Trace, patterns: Patterns | None = None) -> list[RankWork]:
    """Every rank's activity, windowed by its steps and over the whole capture."""
    patterns = patterns or Patterns()
    steps = find_steps(trace.nvtx, patterns)
    ranges = _ranges_by_phase(trace, patterns)
    ranges["comm"] = ranges["comm"].assign(counted=counted_comm_ranges(ranges["comm"]))
    ops = trace.gpu_ops
    backward_mask = launched_inside(ops, ranges["backward"]) if len(ops) else np.zeros(0, bool)
    comm_kernel = (ops["is_comm"].to_numpy() & (codes(ops["kind"]) == KERNEL)) if len(ops) else np.zeros(0, bool)
    groups = ops.groupby(["part", "pid", "device"], sort=False).indices if len(ops) else {}
    out = []
    build: Callable[[Windowing], RankActivity]  # the rank's activity with its times windowed by a Windowing
    for _, rank in trace.ranks.iterrows():  # one iteration per rank
        part, pid, device = int(rank["part"]), int(rank["pid"]), int(rank["device"])
        comm = _of_process(ranges["comm"], part, pid)
        counted = comm["counted"].to_numpy(dtype=bool)
        mine = _of_process(steps, part, pid)
        if trace.source == "gpu":
            rows = groups[(part, pid, device)]
            launch = np.r_[ops["launch_start"].to_numpy()[rows], comm["start"].to_numpy()]
            work_end = np.r_[ops["end"].to_numpy()[rows], comm["end"].to_numpy()]
            windows = step_windows(mine, True, launch, work_end)
            host = is_host_side(trace, part, pid, int(comm_kernel[rows].sum()), int(counted.sum()))
            build = _gpu_builder(trace, rows, backward_mask, comm, counted, host)
            sources = ("ranges" if host else "kernels", "kernels")
        else:
            phase = {name: _of_process(frame, part, pid) for name, frame in ranges.items()}
            own = _of_process(trace.nvtx, part, pid)
            own = own[codes(own["kind"]) != MARK]
            span = (int(own["start"].min()), int(own["end"].max())) if len(own) else (0, 0)
            launch, work_end = own["start"].to_numpy(), own["end"].to_numpy()
            windows = step_windows(mine, False, launch, work_end)
            build = partial(_nvtx_activity, phase, counted=counted, span=span)
            sources = ("ranges", "ranges")
        windows["work_end"] = _work_end(windows, launch, work_end)
        whole = build(lambda t: np.zeros(len(t), dtype=np.int64))
        per_step = build(partial(window_index, windows))
        out.append(RankWork(int(rank["rank"]), part, pid, device, windows, per_step, whole, *sources))
    return out


def _rank_frames(work: RankWork) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(per-step rows, total row) for one rank."""
    span = work.whole.span
    total = window_metrics(work.whole, 1, (np.array([span[0]]), np.array([span[1]])))
    w = work.windows
    if len(w):
        per_step = window_metrics(work.steps, len(w), (w["start"].to_numpy(), w["end"].to_numpy()))
        per_step.insert(0, "step", pd.array(w["step"].to_numpy(), dtype="Int64"))
    else:  # no step ranges: the whole capture is the one window
        per_step = total.copy()
        per_step.insert(0, "step", pd.array([None], dtype="Int64"))
    return per_step, total


def measure_trace(trace: Trace, patterns: Patterns | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(per-step frame, per-rank total frame), each keyed by rank, pid, device, with the rank's
    comm_source, compute_source and shared_gpu (its GPU also runs another rank's work)."""
    from analysis.run_info import shared_gpu_ranks

    shared = shared_gpu_ranks(trace)
    step_rows: list[pd.DataFrame] = []
    total_rows: list[pd.DataFrame] = []
    for work in rank_work(trace, patterns):
        per_step, total = _rank_frames(work)
        for frame, bucket in ((per_step, step_rows), (total, total_rows)):
            frame.insert(0, "device", work.device)
            frame.insert(0, "pid", work.pid)
            frame.insert(0, "rank", work.rank)
            frame["comm_source"], frame["compute_source"] = work.comm_source, work.compute_source
            frame["shared_gpu"] = work.rank in shared
            bucket.append(frame)
    return pd.concat(step_rows, ignore_index=True), pd.concat(total_rows, ignore_index=True)


def summarise(per_step: pd.DataFrame) -> dict:
    """Metrics averaged over the given steps of all ranks; overlap_pct from the averaged times."""
    if len(per_step) == 0:
        return {"ranks": 0, "steps": 0, **dict.fromkeys(METRICS)}
    means = per_step[[m for m in METRICS if m in per_step]].mean(numeric_only=True)
    out = {m: float(means[m]) if m in means else None for m in METRICS if m != "overlap_pct"}
    overlap, comm = out["overlap_ms"], out["comm_ms"]
    out["overlap_pct"] = 100.0 * overlap / comm if overlap is not None and comm and comm > 0 else None
    steps = int(per_step["step"].notna().sum()) if "step" in per_step else len(per_step)
    return {"ranks": int(per_step["rank"].nunique()), "steps": steps, **out}
