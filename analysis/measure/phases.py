"""NVTX projection: which GPU work belongs to which NVTX range, and which work is communication.

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
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike

from analysis.measure import intervals as iv
from analysis.trace.frames import GPU_KERNEL, GPU_MEMCPY, NVTX_MARK, NVTX_PUSH_POP
from analysis.trace.merge import group_index
from analysis.trace.patterns import Patterns, matches


def codes(column: pd.Series) -> np.ndarray:
    """Category codes of a kind column (comparing ints is ~100x faster than comparing strings)."""
    return column.cat.codes.to_numpy()


def process_key(part: ArrayLike, pid: ArrayLike) -> np.ndarray:
    """One int64 per (file part, process)."""
    return (np.asarray(part, dtype=np.int64) << 24) | np.asarray(pid, dtype=np.int64)


def of_process(frame: pd.DataFrame, part: int, pid: int) -> pd.DataFrame:
    """The rows of one process (file part, pid)."""
    return frame[(frame["part"].to_numpy() == part) & (frame["pid"].to_numpy() == pid)]


def thread_key(part: ArrayLike, pid: ArrayLike, tid: ArrayLike) -> np.ndarray:
    """One int64 per (file part, process, thread)."""
    return (process_key(part, pid) << 24) | np.asarray(tid, dtype=np.int64)


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
    has_launch = ops["launch_start"].to_numpy() >= 0
    if len(ranges) == 0 or not has_launch.any():
        return np.zeros(len(ops), dtype=bool)
    if per_thread:
        set_keys = thread_key(ranges["part"], ranges["pid"], ranges["tid"])
        keys = thread_key(ops["part"], ops["pid"], ops["launch_tid"])
    else:
        set_keys = process_key(ranges["part"], ranges["pid"])
        keys = process_key(ops["part"], ops["pid"])
    inside = keyed_contains(set_keys, ranges["start"], ranges["end"], keys, ops["launch_start"].to_numpy())
    return inside & has_launch


def comm_streams(ops: pd.DataFrame, named_comm: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per op: (its stream runs no compute kernel, its stream runs comm kernels), streams keyed by
    (part, pid, device, stream)."""
    # the streams numbered from each key's factorize: pandas' groupby copied the frame's columns (+470 MB at 10M)
    inverse = group_index(*(ops[c].to_numpy() for c in ("part", "pid", "device", "stream")))
    n = int(inverse.max()) + 1 if inverse.size else 0
    is_kernel = codes(ops["kind"]) == GPU_KERNEL
    compute_on = np.bincount(inverse[is_kernel & ~named_comm], minlength=n) > 0
    comm_on = np.bincount(inverse[named_comm], minlength=n) > 0
    return ~compute_on[inverse], comm_on[inverse]


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
