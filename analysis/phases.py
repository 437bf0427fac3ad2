"""NVTX projection: which GPU work belongs to which NVTX range, and which work is communication.

GPU work belongs to a range when its launching runtime call (launch_start) lies inside the range on
the CPU. Phases (step, forward, backward, optimizer) are matched per process, not per thread:
PyTorch launches backward kernels from its autograd threads while `backward` is pushed on the main
thread. A communication range claims kernels only when it is blocking (push/pop) and they are
launched on its own thread (an async `comm:` range stays open while the same thread goes on
launching backward compute), and claims copies launched anywhere in its process (gloo stages CUDA
tensors through copies on its own worker threads). Memcpy is never compute either way.
"""
from __future__ import annotations

import re

import numpy as np
import pandas as pd

from analysis import intervals as iv
from analysis.patterns import Patterns, matches

PUSH_POP, START_END, MARK = 0, 1, 2  # nvtx kind codes (trace.NVTX_KIND_NAMES)
KERNEL, MEMCPY, MEMSET = 0, 1, 2  # gpu_ops kind codes (trace.GPU_KINDS)


def codes(column: pd.Series) -> np.ndarray:
    """Category codes of a kind column (comparing ints is ~100x faster than comparing strings)."""
    return column.cat.codes.to_numpy()


def process_key(part, pid) -> np.ndarray:
    """One int64 per (file part, process)."""
    return (np.asarray(part, dtype=np.int64) << 24) | np.asarray(pid, dtype=np.int64)


def thread_key(part, pid, tid) -> np.ndarray:
    """One int64 per (file part, process, thread)."""
    return (process_key(part, pid) << 24) | np.asarray(tid, dtype=np.int64)


def ranges_named(nvtx: pd.DataFrame, regex: re.Pattern) -> pd.DataFrame:
    """The NVTX ranges (not marks) whose text matches."""
    is_range = codes(nvtx["kind"]) != MARK
    hit = np.zeros(len(nvtx), dtype=bool)
    hit[is_range] = matches(nvtx["text"][is_range], regex)
    return nvtx[hit]


def keyed_contains(set_keys, set_starts, set_ends, keys, t) -> np.ndarray:
    """For each (key, t): whether t lies inside the union of that key's intervals."""
    set_keys, keys, t = np.asarray(set_keys), np.asarray(keys), np.asarray(t)
    out = np.zeros(t.shape, dtype=bool)
    uk, s, e = iv.keyed_union(set_keys, set_starts, set_ends)
    bounds = np.searchsorted(uk, np.unique(uk)), np.searchsorted(uk, np.unique(uk), side="right")
    for key, lo, hi in zip(np.unique(uk), *bounds):  # one iteration per process/thread, not per event
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


def communication_mask(ops: pd.DataFrame, nvtx: pd.DataFrame, patterns: Patterns) -> np.ndarray:
    """is_comm: comm-named kernels; kernels launched inside a blocking (push/pop) comm range on the same
    thread; copies launched inside any comm range of the process. An async (start/end) comm range stays
    open while the same thread goes on launching backward compute, so it claims only copies."""
    kind = codes(ops["kind"])
    named = matches(ops["name"], patterns.regex("comm_kernel")) & (kind == KERNEL)
    comm_ranges = ranges_named(nvtx, patterns.regex("comm_range"))
    blocking = comm_ranges[codes(comm_ranges["kind"]) == PUSH_POP]
    same_thread = launched_inside(ops, blocking, per_thread=True) & (kind == KERNEL)
    copies = launched_inside(ops, comm_ranges) & (kind == MEMCPY)
    return named | same_thread | copies


def find_steps(nvtx: pd.DataFrame, patterns: Patterns) -> pd.DataFrame:
    """Step ranges: part, pid, step (number from the pattern's first group, else order), start, end."""
    regex = patterns.regex("step")
    ranges = ranges_named(nvtx, regex).sort_values(["part", "pid", "start"])
    numbers = ranges["text"].map(lambda text: _step_number(regex, text))
    ordinal = ranges.groupby(["part", "pid"]).cumcount()
    step = np.where(numbers.notna(), numbers.fillna(-1), ordinal).astype(np.int64)
    return pd.DataFrame({"part": ranges["part"].to_numpy(), "pid": ranges["pid"].to_numpy(), "step": step,
                         "start": ranges["start"].to_numpy(), "end": ranges["end"].to_numpy()})


def _step_number(regex: re.Pattern, text: str) -> float:
    found = regex.search(text)
    if found and found.groups() and found.group(1) and found.group(1).isdigit():
        return float(found.group(1))
    return float("nan")


def step_of(steps: pd.DataFrame, part, pid, t) -> np.ndarray:
    """For each (part, pid, t): the number of the step range containing t in that process, else -1."""
    keys, t = process_key(part, pid), np.asarray(t, dtype=np.int64)
    out = np.full(t.shape, -1, dtype=np.int64)
    step_keys = process_key(steps["part"], steps["pid"])
    for key in np.unique(step_keys):  # one iteration per process
        mine = step_keys == key
        s, e, n = (steps[c].to_numpy()[mine] for c in ("start", "end", "step"))
        rows = np.flatnonzero(keys == key)
        i = np.searchsorted(s, t[rows], side="right") - 1  # latest step starting at or before t
        hit = (i >= 0) & (t[rows] >= 0) & (t[rows] < e[np.maximum(i, 0)])
        out[rows] = np.where(hit, n[np.maximum(i, 0)], -1)
    return out
