"""NVTX projection: which GPU work belongs to which NVTX range and which step, and which work is communication.

GPU work belongs to a range when its launching runtime call (launch_start) lies inside the range on
the CPU. Phases (step, forward, backward, optimizer) are matched per process, not per thread:
PyTorch launches backward kernels from its autograd threads while `backward` is pushed on the main
thread. Communication is work that is part of a collective:
  - kernels whose name matches the comm-kernel pattern (NCCL, RCCL, ...);
  - kernels and copies launched inside a *blocking* (push/pop) comm range on that range's thread;
  - copies on a *comm stream* of their process and device: a stream that runs no compute kernel and
    either runs comm kernels (NCCL's own stream) or the copy was launched while a comm range of the
    process was open (gloo stages CUDA tensors through host memory on its own streams and threads).
An async (start/end) comm range stays open while the same thread goes on launching backward work,
so it claims nothing on the compute stream: the bucket-packing copies backward launches there
while another bucket is in flight are not communication. Memcpy is never compute either way.

Step windows (`step_windows`): when a step begins and ends, and which work it launched. A trace marks
steps with CPU NVTX ranges (`step N`). On the CPU they are the step: the host does the work inside them.
With a GPU the host only *launches* work, and when it does not wait for the GPU at the end of a step
(PyTorch DDP does not, nor do most training loops) the GPU runs on past the CPU range. So on ranks with GPU work:

  - step k lasts from its start to step k+1's start (the period of the loop, which is what the
    run's own timer measures); its work is everything launched in [start_k, start_k+1);
  - the last step has no successor: its work is what was launched inside its CPU range, and it lasts
    until the later of its CPU end and the end of that work.

On ranks without GPU work (CPU-only traces) a step is its CPU range and owns what starts inside it.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike

from analysis.measure import intervals as iv
from analysis.trace.build_frames import factorize, rank_rows
from analysis.trace.frames import GPU_KERNEL, GPU_MEMCPY, NVTX_MARK, NVTX_PUSH_POP
from analysis.trace.patterns import Patterns, matches


def codes(column: pd.Series) -> np.ndarray:
    """Category codes of a kind column (comparing ints is ~100x faster than comparing strings)."""
    return column.cat.codes.to_numpy()


def process_key(part: ArrayLike, pid: ArrayLike) -> np.ndarray:
    """One int64 per (file part, process)."""
    # a copy of our own (as wide as both), shifted and or-ed in place: one 8-byte array a row, no temporaries
    key = np.array(np.broadcast_to(part, np.broadcast_shapes(np.shape(part), np.shape(pid))), dtype=np.int64)
    key <<= 24
    key |= _signed(pid)
    return key if key.ndim else key[()]  # scalars in, a scalar out


def of_process(frame: pd.DataFrame, part: int, pid: int) -> pd.DataFrame:
    """The rows of one process (file part, pid)."""
    return frame[(frame["part"].to_numpy() == part) & (frame["pid"].to_numpy() == pid)]


def thread_key(part: ArrayLike, pid: ArrayLike, tid: ArrayLike) -> np.ndarray:
    """One int64 per (file part, process, thread)."""
    key = process_key(part, pid)
    key <<= 24
    key |= _signed(tid)
    return key


def _signed(values: ArrayLike) -> np.ndarray:
    """Signed integers as they are (or-ed into an int64 key they widen as a cast would), anything else as int64."""
    a = np.asarray(values)
    return a if a.dtype.kind == "i" else a.astype(np.int64)


def ranges_named(nvtx: pd.DataFrame, regex: re.Pattern) -> pd.DataFrame:
    """The NVTX ranges (not marks) whose text matches."""
    is_range = codes(nvtx["kind"]) != NVTX_MARK
    hit = np.zeros(len(nvtx), dtype=bool)
    hit[is_range] = matches(nvtx["text"][is_range], regex)
    return nvtx[hit]


def keyed_contains(
    set_keys: ArrayLike, set_starts: ArrayLike, set_ends: ArrayLike, keys: ArrayLike, t: ArrayLike
) -> np.ndarray:
    """For each (key, t): whether t lies inside the union of that key's intervals."""
    set_keys, keys, t = np.asarray(set_keys), np.asarray(keys), np.asarray(t)
    out = np.zeros(t.shape, dtype=bool)
    uk, s, e = iv.keyed_union(set_keys, set_starts, set_ends)
    bounds = np.searchsorted(uk, np.unique(uk)), np.searchsorted(uk, np.unique(uk), side="right")
    for key, lo, hi in zip(np.unique(uk), *bounds, strict=True):  # one iteration per process/thread, not per event
        rows = np.flatnonzero(keys == key)
        out[rows] = iv.contains(s[lo:hi], e[lo:hi], t[rows])
    return out


def launched_inside(ops: pd.DataFrame, ranges: pd.DataFrame, per_thread: bool = False) -> np.ndarray:
    """Which GPU ops were launched (runtime call start) inside one of `ranges` of the same process/thread."""
    launch = ops["launch_start"].to_numpy()
    has_launch = launch >= 0
    inside = np.zeros(len(ops), dtype=bool)
    if len(ranges) == 0 or not has_launch.any():
        return inside
    processes = process_key(ranges["part"], ranges["pid"])
    starts, ends = ranges["start"].to_numpy(), ranges["end"].to_numpy()
    if per_thread:
        range_tids, launch_tids = ranges["tid"].to_numpy(), ops["launch_tid"].to_numpy()
    # rank by rank (its rows are one run of gpu_ops): keys for every row at once held ~150 MB at 10M kernels
    for (part, pid, _), rows in rank_rows(ops).items():  # one iteration per rank
        mine = processes == process_key(part, pid)
        if not mine.any():
            continue
        if per_thread:
            found = keyed_contains(range_tids[mine], starts[mine], ends[mine], launch_tids[rows], launch[rows])
        else:
            found = iv.contains(*iv.union(starts[mine], ends[mine]), launch[rows])
        inside[rows] = found & has_launch[rows]
    return inside


def comm_streams(ops: pd.DataFrame, named_comm: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per op: (its stream runs no compute kernel, its stream runs comm kernels), streams keyed by
    (part, pid, device, stream)."""
    # rank by rank (a rank's rows are one run of gpu_ops): numbering every row's stream at once held
    # ~300 MB of keys at 10M kernels, one rank's streams hold an eighth of that at 8 ranks
    no_compute, runs_comm = np.zeros(len(ops), dtype=bool), np.zeros(len(ops), dtype=bool)
    stream = ops["stream"].to_numpy()
    computes = (codes(ops["kind"]) == GPU_KERNEL) & ~named_comm
    for rows in rank_rows(ops).values():  # one iteration per rank
        inverse = factorize(stream[rows])[1]
        n = int(inverse.max()) + 1
        compute_on = np.bincount(inverse[computes[rows]], minlength=n) > 0
        comm_on = np.bincount(inverse[named_comm[rows]], minlength=n) > 0
        no_compute[rows], runs_comm[rows] = ~compute_on[inverse], comm_on[inverse]
    return no_compute, runs_comm


def communication_mask(ops: pd.DataFrame, nvtx: pd.DataFrame, patterns: Patterns) -> np.ndarray:
    """is_comm by the rule in the module docstring."""
    kind = codes(ops["kind"])
    named = matches(ops["name"], patterns.regex("comm_kernel")) & (kind == GPU_KERNEL)
    comm_ranges = ranges_named(nvtx, patterns.regex("comm_range"))
    blocking = comm_ranges[codes(comm_ranges["kind"]) == NVTX_PUSH_POP]
    same_thread = launched_inside(ops, blocking, per_thread=True) & np.isin(kind, (GPU_KERNEL, GPU_MEMCPY))
    no_compute, runs_comm = comm_streams(ops, named)
    staged = no_compute & (runs_comm | launched_inside(ops, comm_ranges)) & (kind == GPU_MEMCPY)
    return named | same_thread | staged


def counted_comm_ranges(ranges: pd.DataFrame) -> np.ndarray:
    """Which comm ranges count as a collective of their own: NCCL's own NVTX ranges (domain NCCL,
    `ncclAllReduce`) are dropped where they lie inside another comm range of the process (the
    project's `comm:*` range of the same collective), so each collective is counted once."""
    nccl = (ranges["domain"].astype(str) == "NCCL").to_numpy()
    if not nccl.any() or nccl.all():
        return np.ones(len(ranges), dtype=bool)
    outer = ranges[~nccl]
    keys = process_key(ranges["part"], ranges["pid"])
    outer_keys = process_key(outer["part"], outer["pid"])
    start, end = ranges["start"].to_numpy(), ranges["end"].to_numpy()
    inside = keyed_contains(outer_keys, outer["start"], outer["end"], keys, start) & keyed_contains(
        outer_keys, outer["start"], outer["end"], keys, np.maximum(end - 1, start)
    )
    return ~(nccl & inside)


def find_steps(nvtx: pd.DataFrame, patterns: Patterns) -> pd.DataFrame:
    """Step ranges: part, pid, step (number from the pattern's first group, else order), start, end."""
    regex = patterns.regex("step")
    ranges = ranges_named(nvtx, regex).sort_values(["part", "pid", "start"])
    numbers = ranges["text"].map(lambda text: _step_number(regex, text))
    ordinal = ranges.groupby(["part", "pid"]).cumcount()
    step = np.where(numbers.notna(), numbers.fillna(-1), ordinal).astype(np.int64)
    return pd.DataFrame(
        {
            "part": ranges["part"].to_numpy(),
            "pid": ranges["pid"].to_numpy(),
            "step": step,
            "start": ranges["start"].to_numpy(),
            "end": ranges["end"].to_numpy(),
        }
    )


def _step_number(regex: re.Pattern, text: str) -> float:
    found = regex.search(text)
    if found and found.groups() and found.group(1) and found.group(1).isdigit():
        return float(found.group(1))
    return float("nan")


def step_windows(steps: pd.DataFrame, gpu: bool, launch: np.ndarray, work_end: np.ndarray) -> pd.DataFrame:
    """One rank's windows: step, start, launch_end (work launched in [start, launch_end) is the
    step's), end (the step lasts [start, end)). `steps`: that rank's step ranges (step, start, end);
    launch/work_end: when each piece of its work was launched and when it ended (GPU ranks)."""
    steps = steps.sort_values("start", kind="stable")
    start, cpu_end = steps["start"].to_numpy(np.int64), steps["end"].to_numpy(np.int64)
    if not gpu or start.size == 0:
        return pd.DataFrame({"step": steps["step"].to_numpy(), "start": start, "launch_end": cpu_end, "end": cpu_end})
    launch_end = np.r_[start[1:], cpu_end[-1]]
    end = launch_end.copy()
    last = (launch >= start[-1]) & (launch < cpu_end[-1])
    end[-1] = max(int(cpu_end[-1]), int(work_end[last].max()) if last.any() else 0)
    return pd.DataFrame({"step": steps["step"].to_numpy(), "start": start, "launch_end": launch_end, "end": end})


def window_index(windows: pd.DataFrame, t: np.ndarray) -> np.ndarray:
    """For each time t: the index (0..n-1) of the window whose launch span [start, launch_end)
    contains it, else -1."""
    start, launch_end = windows["start"].to_numpy(np.int64), windows["launch_end"].to_numpy(np.int64)
    t = np.asarray(t, dtype=np.int64)
    if start.size == 0:
        return np.full(t.shape, -1, dtype=np.int64)
    i = np.searchsorted(start, t, side="right") - 1  # latest window starting at or before t
    hit = (i >= 0) & (t >= 0) & (t < launch_end[np.maximum(i, 0)])
    return np.where(hit, i, -1)
