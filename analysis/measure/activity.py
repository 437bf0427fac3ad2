"""The one place that says what each rank was doing: its communication, compute and backward-pass
compute as interval sets, per step window and over the whole capture (`rank_work`), and where
communication lies under compute (rank_periods.py). The metrics (metrics.py), the collectives'
exposed time (collective_calls.py) and the timeline's shading (timeline/lanes.py) all draw from these sets.

Which work is communication is decided once, when the trace is loaded (gpu_ops.is_comm, by
phases.communication_mask); here the comm *ranges* (comm-range pattern) stand in for it where the
GPU does not see the collectives: CPU-only ranks, and GPU ranks whose collectives run on the host.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import numpy as np
import pandas as pd

from analysis.machine import release_free_memory
from analysis.measure import intervals as iv
from analysis.measure.phases import (
    codes,
    counted_comm_ranges,
    find_steps,
    launched_inside,
    of_process,
    ranges_named,
    step_windows,
    window_index,
)
from analysis.measure.torch_calls import FSDP_WAIT
from analysis.trace.build_frames import rank_rows
from analysis.trace.frames import GPU_KERNEL, GPU_MEMCPY, KERNELS, NVTX_MARK, NVTX_PUSH_POP, RANGES, Trace
from analysis.trace.patterns import Patterns
from contract.patterns import COMM_WAIT

Windowing = Callable[[np.ndarray], np.ndarray]  # times -> index of their window (-1: in none)
WINDOW = np.int16  # an item's window: a quarter of the bytes of int64, where a rank has fewer than 2**15 steps
WIDE_WINDOW = np.int32  # where it has more


@dataclass(frozen=True)
class Items:
    """Intervals with the window (0..n-1, or -1 for none) each belongs to."""

    window: np.ndarray
    start: np.ndarray
    end: np.ndarray
    # the union of start/end once computed (as_set): the metrics, the collectives' exposed time and the
    # overlap periods all ask for it; shared with the whole-capture Items made by in_one_window
    _set: list[iv.Set] = field(default_factory=list, compare=False, repr=False)

    def where(self, mask: np.ndarray) -> Items:
        """The items the boolean mask keeps (these very Items, with their union, when it keeps all)."""
        if mask.all():
            return self
        return Items(self.window[mask], self.start[mask], self.end[mask])

    def as_set(self) -> iv.Set:
        """The union of the items (computed on the first call, then kept)."""
        if not self._set:
            self._set.append(iv.union(self.start, self.end))
        return self._set[0]

    def in_one_window(self) -> Items:
        """The same intervals, all in window 0 (a zero-strided window array: no copy of anything)."""
        return Items(np.broadcast_to(WINDOW(0), self.start.shape), self.start, self.end, self._set)

    def of_window(self, w: int) -> Items:
        return self.where(self.window == w)


@dataclass(frozen=True)
class RankActivity:
    """What one rank did, reduced to the intervals the metrics need."""

    comm: Items
    compute: Items
    # the compute that belongs to the backward pass (`backward`): its own items, or on GPU ranks a mask over
    # compute's items, 1 byte an item where a copy of them took 20 (100 MB at 10M kernels)
    backward_part: Items | np.ndarray
    comm_kernels: Items  # GPU communication kernels (empty on CPU-only ranks)
    comm_copies: Items  # GPU copies that are part of a collective
    comm_range_windows: np.ndarray  # window of each counted comm NVTX range (counted only)
    span: tuple[int, int]
    compute_are_kernels: bool = True

    @property
    def backward(self) -> Items:
        """The compute that belongs to the backward pass (made from compute's items when kept as a mask)."""
        part = self.backward_part
        return self.compute.where(part) if isinstance(part, np.ndarray) else part

    def comm_alone(self) -> iv.Set:
        """Where the rank communicated and did not compute: with its compute, where it did something. Its
        compute and this are disjoint, so their lengths add up to the busy time, and no union of the two is
        made (one copied and sorted every compute kernel of the rank again)."""
        return iv.subtract(*self.comm.as_set(), *self.compute.as_set())

    def in_one_window(self) -> RankActivity:
        """The same activity with everything in window 0 (the whole capture), sharing its arrays."""
        return RankActivity(
            comm=self.comm.in_one_window(),
            compute=self.compute.in_one_window(),
            backward_part=part if isinstance(part := self.backward_part, np.ndarray) else part.in_one_window(),
            comm_kernels=self.comm_kernels.in_one_window(),
            comm_copies=self.comm_copies.in_one_window(),
            comm_range_windows=np.broadcast_to(WINDOW(0), self.comm_range_windows.shape),
            span=self.span,
            compute_are_kernels=self.compute_are_kernels,
        )


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


Rows = slice | np.ndarray  # a rank's rows of gpu_ops (merge.rank_rows): one run of them, or their positions


def _gpu_activity(
    trace: Trace,
    rows: Rows,
    window: np.ndarray,
    backward_mask: np.ndarray,
    ranges: pd.DataFrame,
    range_window: np.ndarray,
    counted: np.ndarray,
    host_side: bool,
) -> RankActivity:
    """A GPU rank: compute = its compute kernels; comm = its communication kernels and copies, or
    (host_side: collectives run on the CPU) its comm NVTX ranges."""
    ops = trace.gpu_ops
    start, end = ops["start"].to_numpy()[rows], ops["end"].to_numpy()[rows]
    kind, is_comm = codes(ops["kind"])[rows], ops["is_comm"].to_numpy()[rows]
    every = Items(window, start, end)
    compute = (kind == GPU_KERNEL) & ~is_comm  # memcpy, memset and synchronisation are never compute
    on_host = Items(range_window, ranges["start"].to_numpy(), ranges["end"].to_numpy())
    return RankActivity(
        comm=on_host if host_side else every.where(is_comm),
        compute=every.where(compute),
        backward_part=backward_mask[rows][compute],
        comm_kernels=every.where(is_comm & (kind == GPU_KERNEL)),
        comm_copies=every.where(is_comm & (kind == GPU_MEMCPY)),
        comm_range_windows=range_window[counted],
        span=(int(start.min()) if start.size else 0, int(end.max()) if end.size else 0),
    )


def _gpu_builder(
    trace: Trace, rows: Rows, backward_mask: np.ndarray, comm: pd.DataFrame, counted: np.ndarray, host_side: bool
) -> Callable[[Windowing], RankActivity]:
    """_gpu_activity of one rank, its kernels' launches and comm ranges windowed by the function given."""
    launch = trace.gpu_ops["launch_start"].to_numpy()[rows]
    return lambda w: _gpu_activity(
        trace, rows, w(launch), backward_mask, comm, w(comm["start"].to_numpy()), counted, host_side
    )


def _nvtx_activity(
    ranges: dict[str, pd.DataFrame], window_of: Windowing, counted: np.ndarray, span: tuple[int, int]
) -> RankActivity:
    """CPU-only traces: comm = comm ranges in flight; compute = forward/backward/optimizer ranges minus
    blocking comm, gradient-sync waits and waits for one in-flight collective (comm_wait ranges)."""

    def items(frame: pd.DataFrame) -> Items:
        s, e = frame["start"].to_numpy(), frame["end"].to_numpy()
        return Items(window_of(s), s, e)

    comm = items(ranges["comm"])
    blocking = ranges["comm"][codes(ranges["comm"]["kind"]) == NVTX_PUSH_POP]
    waits = pd.concat([blocking, ranges["sync_wait"], ranges["fsdp_wait"], ranges["comm_wait"]])
    blocked = iv.union(waits["start"].to_numpy(), waits["end"].to_numpy())

    # a rank waiting in a blocking collective, for its gradients or for one in-flight collective
    # (comm_wait:<op>:<tag>) is not computing, even inside a forward or backward range
    compute = _cut(items(pd.concat([ranges[p] for p in ("forward", "backward", "optimizer")])), blocked)
    backward = _cut(items(ranges["backward"]), blocked)
    none = comm.where(np.zeros(len(comm.start), bool))
    return RankActivity(
        comm=comm,
        compute=compute,
        backward_part=backward,
        comm_kernels=none,
        comm_copies=none,
        comm_range_windows=comm.window[counted],
        span=span,
        compute_are_kernels=False,
    )


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
    fields = [("comm", "comm_range"), *((p, p) for p in ("forward", "backward", "optimizer", "sync_wait"))]
    ranges = {phase: ranges_named(trace.nvtx, patterns.regex(field)) for phase, field in fields}
    ranges["fsdp_wait"] = ranges_named(trace.nvtx, re.compile(FSDP_WAIT))  # torch_calls.FSDP_WAIT: why
    ranges["comm_wait"] = ranges_named(trace.nvtx, re.compile(COMM_WAIT))
    return ranges


def _work_end(windows: pd.DataFrame, launch: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Per window: the later of its end and the last end of the work launched in it."""
    out = windows["end"].to_numpy(np.int64).copy()
    w = window_index(windows, launch)
    np.maximum.at(out, w[w >= 0], end[w >= 0])
    return out


def _windowing(windows: pd.DataFrame) -> Windowing:
    """Each time's window among the rank's step windows (steps.window_index), as WINDOW ints (WIDE_WINDOW
    ones for a rank with more steps than those hold)."""
    dtype = WINDOW if len(windows) < np.iinfo(WINDOW).max else WIDE_WINDOW
    return lambda t: window_index(windows, t).astype(dtype)


def is_host_side(trace: Trace, part: int, pid: int, comm_kernels: int, comm_ranges: int) -> bool:
    """Whether a GPU rank's collectives run on the host: `ddp.meta` says gloo, or it has comm ranges
    but no communication kernels."""
    backend = str(trace.meta.get((part, pid), {}).get("backend", "")).lower()
    return backend == "gloo" or (comm_kernels == 0 and comm_ranges > 0)


def rank_work(trace: Trace, patterns: Patterns | None = None, steps: pd.DataFrame | None = None) -> list[RankWork]:
    """Every rank's activity, windowed by its steps and over the whole capture (measured once per run, by
    loaded_run.measure_run, and handed down); `steps`: the trace's phases.find_steps when the caller has them."""
    patterns = patterns or Patterns()
    steps = steps if steps is not None else find_steps(trace.nvtx, patterns)
    ranges = _ranges_by_phase(trace, patterns)
    ranges["comm"] = ranges["comm"].assign(counted=counted_comm_ranges(ranges["comm"]))
    ops = trace.gpu_ops
    backward_mask = launched_inside(ops, ranges["backward"]) if len(ops) else np.zeros(0, bool)
    comm_kernel = (ops["is_comm"].to_numpy() & (codes(ops["kind"]) == GPU_KERNEL)) if len(ops) else np.zeros(0, bool)
    groups = rank_rows(ops)
    out = []
    build: Callable[[Windowing], RankActivity]  # the rank's activity with its times windowed by a Windowing
    for _, rank in trace.ranks.iterrows():  # one iteration per rank
        part, pid, device = int(rank["part"]), int(rank["pid"]), int(rank["device"])
        comm = of_process(ranges["comm"], part, pid)
        counted = comm["counted"].to_numpy(dtype=bool)
        mine = of_process(steps, part, pid)
        if trace.source == KERNELS:
            rows = groups[(part, pid, device)]
            host = is_host_side(trace, part, pid, int(comm_kernel[rows].sum()), int(counted.sum()))
            # the step's work is its GPU work; its comm ranges only where they are the communication
            # (host-side collectives): with NCCL an async range ends where the host noticed completion
            ranged = comm if host else comm.iloc[:0]
            launch = np.r_[ops["launch_start"].to_numpy()[rows], ranged["start"].to_numpy()]
            work_end = np.r_[ops["end"].to_numpy()[rows], ranged["end"].to_numpy()]
            windows = step_windows(mine, True, launch, work_end)
            build = _gpu_builder(trace, rows, backward_mask, comm, counted, host)
            sources = (RANGES if host else KERNELS, KERNELS)
        else:
            phase = {name: of_process(frame, part, pid) for name, frame in ranges.items()}
            own = of_process(trace.nvtx, part, pid)
            own = own[codes(own["kind"]) != NVTX_MARK]
            span = (int(own["start"].min()), int(own["end"].max())) if len(own) else (0, 0)
            launch, work_end = own["start"].to_numpy(), own["end"].to_numpy()
            windows = step_windows(mine, False, launch, work_end)
            build = partial(_nvtx_activity, phase, counted=counted, span=span)
            sources = (RANGES, RANGES)
        windows["work_end"] = _work_end(windows, launch, work_end)
        per_step = build(_windowing(windows))
        # GPU ranks: the whole capture holds the same items as the steps (the windowing picks none),
        # so it shares their arrays; CPU-only ranks cut their compute per window and build it anew
        whole = per_step.in_one_window() if trace.source == KERNELS else build(lambda t: np.zeros(len(t), WINDOW))
        out.append(RankWork(int(rank["rank"]), part, pid, device, windows, per_step, whole, *sources))
    release_free_memory()  # each rank's windowing left freed pieces in the heap (about 50 MB at 10M kernels)
    return out
