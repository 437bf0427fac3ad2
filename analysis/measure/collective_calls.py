"""Every collective call of every rank, before pairing: `find_calls(trace) -> Calls`.

Two sources, chosen per trace:
- "kernels" (GPU traces with communication kernels): one call per kernel whose name matches the
  comm-kernel pattern (NCCL, RCCL, DeepEP, ...: trace/comm_families.py names each call's
  `family`). Arrival = kernel start, completion = kernel end. The call's
  `comm:<op>:<tag>` range (README contract) is the latest one opened on the launching thread before
  the launch and still open then: it gives the tag, the byte count (the range's integer payload) and
  the issue time (range start); without one, issue is the launch call's start and tag/bytes are unknown.
  A call's step is the step whose window (phases.step_windows) holds its issue time, as for the overlap metrics.
- "ranges" (CPU traces, and GPU traces whose collectives run on the host, e.g. gloo): one call per
  `comm:<op>:<tag>` range. Arrival = range start (issue), completion = range end: the rank entered
  the collective at issue and saw it complete at the end (for an async range, when it waited for it).

Bytes come from the range payload, else from the kernel's own args (torch.profiler records the element
counts and dtype on NCCL kernels: gpu_ops.comm_bytes), else from `ddp.meta`'s bucket layout (tag =
bucket name), else stay unknown (NaN): never guessed. Compute per rank (for the exposed part) is the analysis' own
(activity.rank_work): its compute kernels (also when its collectives run on the host), or on
CPU-only traces its forward/backward/optimizer ranges minus blocking comm ranges and `grad_sync` waits.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike

from analysis.measure.activity import RankWork, rank_work
from analysis.measure.call_groups import FOLDED, FOREIGN, GROUP_COLUMNS, OURS, fold_inferred, group_columns, world_size
from analysis.measure.phases import (
    codes,
    find_steps,
    keyed_contains,
    process_key,
    ranges_named,
    step_windows,
    thread_key,
    window_index,
)
from analysis.measure.rank_periods import compute_sets
from analysis.measure.torch_calls import foreign_comm_ranges
from analysis.trace.comm_families import family_of_range, kernel_families
from analysis.trace.frames import GPU_KERNEL, KERNELS, NVTX_MARK, RANGES, Trace
from analysis.trace.patterns import Patterns, matches
from contract import BACKWARD, COMM_PREFIX, FORWARD, GRAD_SYNC, GROUP_SEPARATOR, OPTIMIZER

# op, tag, and the process group after GROUP_SEPARATOR (contract/groups.py; absent: the default group)
_AT = re.escape(GROUP_SEPARATOR)
COMM_CALL = re.compile(rf"^{re.escape(COMM_PREFIX)}([^:]+):?(.*?)(?:{_AT}([^{_AT}:]+))?$")
# kernel-name fragment (lower case, underscores removed) -> op; ReduceScatter before Reduce
KERNEL_OPS = (
    ("reducescatter", "reduce_scatter"),
    ("allreduce", "all_reduce"),
    ("allgather", "all_gather"),
    ("alltoall", "all_to_all"),
    ("broadcast", "broadcast"),
    ("sendrecv", "send_recv"),
    ("send", "send_recv"),
    ("recv", "send_recv"),
    ("reduce", "reduce"),
    ("dispatch", "all_to_all"),  # expert-parallel token exchange (DeepEP dispatch / combine)
    ("combine", "all_to_all"),
)
PHASES = ((GRAD_SYNC, "sync_wait"), (OPTIMIZER, "optimizer"), (BACKWARD, "backward"), (FORWARD, "forward"))
# the phase of a call issued outside every step of a process that has steps (the closing barrier, a
# set-up broadcast): not a training collective, listed but left out of the summaries (collectives_view)
OUTSIDE_STEPS = "outside steps"
CALL_COLUMNS = [
    "rank",
    "part",
    "pid",
    "device",
    "op",
    "tag",
    "bytes",
    "issue_ns",
    "start_ns",
    "end_ns",
    "step",
    "phase",
    "kernel",
    "family",
    *GROUP_COLUMNS,
    FOLDED,
]


@dataclass(frozen=True)
class Calls:
    """One row per call (CALL_COLUMNS, sorted by rank then arrival), the source, and each rank's compute."""

    frame: pd.DataFrame
    source: str  # KERNELS | RANGES
    compute: dict  # rank -> canonical interval set (starts, ends) of that rank's compute


def op_of_kernel(name: str) -> str:
    """all_reduce, all_gather, ... from an NCCL/RCCL kernel name; '' when the name does not say (Generic)."""
    flat = name.lower().replace("_", "")
    return next((op for fragment, op in KERNEL_OPS if fragment in flat), "")


def _comm_ranges(trace: Trace) -> pd.DataFrame:
    """The project's `comm:<op>:<tag>` ranges with op, tag and payload split out; in processes without
    them, PyTorch's own collective annotations (`gloo:all_gather`, torch_calls.py)."""
    nvtx = trace.nvtx
    ranges = nvtx[(codes(nvtx["kind"]) != NVTX_MARK) & nvtx["text"].str.startswith(COMM_PREFIX).to_numpy()]
    parts = ranges["text"].str.extract(COMM_CALL)
    ours = ranges.assign(op=parts[0].fillna(""), tag=parts[1].fillna(""), group=parts[2].fillna(OURS))
    foreign = foreign_comm_ranges(nvtx, ours[["part", "pid"]].drop_duplicates()).assign(group=FOREIGN)
    return pd.concat([ours, foreign], ignore_index=True) if len(foreign) else ours


def _bucket_layout(trace: Trace) -> pd.DataFrame:
    """part, pid, tag, layout_bytes: each bucket of the `ddp.meta` bucket layouts (name -> bytes)."""
    rows = [
        (part, pid, str(b["name"]), int(b["bytes"]))
        for (part, pid), meta in trace.meta.items()
        for b in (meta.get("buckets") if isinstance(meta.get("buckets"), list) else [])
        if isinstance(b, dict) and "name" in b and isinstance(b.get("bytes"), int)
    ]
    return pd.DataFrame(rows, columns=["part", "pid", "tag", "layout_bytes"]).drop_duplicates(["part", "pid", "tag"])


def _bytes(frame: pd.DataFrame, trace: Trace) -> np.ndarray:
    """The call's range payload where >= 0, else the size its kernel's args record (Kineto's NCCL
    kernels: max(in, out) bytes, nccl-tests' convention like the payload), else its bucket's bytes in the
    layout, else NaN."""
    payload = frame["payload"].to_numpy()
    kernel = frame["kernel_bytes"].to_numpy() if "kernel_bytes" in frame else np.full(len(frame), -1)
    out = np.where(payload >= 0, payload, np.where(kernel >= 0, kernel, np.nan)).astype(float)
    layout = _bucket_layout(trace)
    if len(layout) and np.isnan(out).any():
        found = frame[["part", "pid", "tag"]].merge(layout, on=["part", "pid", "tag"], how="left")["layout_bytes"]
        out = np.where(np.isnan(out), found.to_numpy(dtype=float), out)
    return out


def _with_ranks(frame: pd.DataFrame, trace: Trace, by_device: bool) -> pd.DataFrame:
    """Attach the rank number (and device) by an inner join on the rank's part/pid[/device]."""
    keys = ["part", "pid", "device"] if by_device else ["part", "pid"]
    ranks = trace.ranks[["rank", "part", "pid", "device"]].drop_duplicates(keys)
    return frame.merge(ranks, on=keys, how="inner")


def _kernel_calls(trace: Trace, patterns: Patterns) -> pd.DataFrame:
    ops = trace.gpu_ops
    # a call is one named communication kernel; is_comm also holds the copies and kernels that are
    # parts of a collective (phases.communication_mask), which are not calls of their own
    # tested on the communication rows only: masks over every row of a 10M-kernel trace held ~60 MB
    comm = np.flatnonzero(ops["is_comm"].to_numpy())
    named = matches(ops["name"].iloc[comm], patterns.regex("comm_kernel"))
    calls = comm[(codes(ops["kind"])[comm] == GPU_KERNEL) & named]
    k = ops[["part", "pid", "device", "start", "end", "launch_start", "launch_tid", "name", "comm_bytes"]].iloc[calls]
    k = k.assign(kernel=k["name"].astype(str), tkey=thread_key(k["part"], k["pid"], np.maximum(k["launch_tid"], 0)))
    k = k.drop(columns="name").sort_values("launch_start", kind="stable")
    ranges = _comm_ranges(trace)
    ranges = ranges.assign(tkey=thread_key(ranges["part"], ranges["pid"], ranges["tid"]))
    ranges = (
        ranges[["tkey", "start", "end", "op", "tag", "payload", "group"]]
        .rename(columns={"start": "r_start", "end": "r_end", "op": "r_op"})
        .sort_values("r_start", kind="stable")
    )
    # the latest comm range opened on the launching thread at or before the launch
    m = pd.merge_asof(k, ranges, left_on="launch_start", right_on="r_start", by="tkey", direction="backward")
    hit = (
        m["r_end"].notna().to_numpy()
        & (m["r_end"].to_numpy(dtype=float) > m["launch_start"].to_numpy())
        & (m["launch_start"].to_numpy() >= 0)
    )
    launch = m["launch_start"].to_numpy()
    names = pd.Categorical(m["kernel"])  # one name test per distinct kernel name, not per kernel
    kernel_op = np.array([op_of_kernel(n) for n in names.categories] or [""], dtype=object)[names.codes]
    range_op = m["r_op"].fillna("").to_numpy(dtype=object)
    out = pd.DataFrame(
        {
            "part": m["part"].to_numpy(),
            "pid": m["pid"].to_numpy(),
            "device": m["device"].to_numpy(),
            "op": np.where(kernel_op != "", kernel_op, np.where(hit, range_op, "unknown")),
            "tag": np.where(hit, m["tag"].fillna("").to_numpy(dtype=object), ""),
            "payload": np.where(hit, m["payload"].fillna(-1).to_numpy(), -1).astype(np.int64),
            "kernel_bytes": m["comm_bytes"].to_numpy(np.int64),
            "issue_ns": np.where(
                hit, m["r_start"].fillna(0).to_numpy(), np.where(launch >= 0, launch, m["start"])
            ).astype(np.int64),
            "start_ns": m["start"].to_numpy(),
            "end_ns": m["end"].to_numpy(),
            "kernel": m["kernel"].to_numpy(dtype=object),
            "family": kernel_families(m["kernel"]),
            "group": np.where(hit, m["group"].fillna(FOREIGN).to_numpy(dtype=object), FOREIGN),
            "probe_ns": np.where(launch >= 0, launch, m["start"]).astype(np.int64),  # torch's record holds the launch
            "probe_open": True,
        }
    )
    return _with_ranks(out, trace, by_device=True)


def _range_calls(trace: Trace) -> pd.DataFrame:
    r = _comm_ranges(trace)
    out = pd.DataFrame(
        {
            "part": r["part"].to_numpy(),
            "pid": r["pid"].to_numpy(),
            "op": r["op"].to_numpy(dtype=object),
            "tag": r["tag"].to_numpy(dtype=object),
            "payload": r["payload"].to_numpy(),
            "issue_ns": r["start"].to_numpy(),
            "start_ns": r["start"].to_numpy(),
            "end_ns": r["end"].to_numpy(),
            "kernel": "",
            "family": _range_families(trace, r),
            "group": r["group"].to_numpy(dtype=object),
            "probe_ns": r["start"].to_numpy(),  # gloo's annotation starts after torch's record was issued
            "probe_open": False,
        }
    )
    return _with_ranks(out, trace, by_device=False)


def _range_families(trace: Trace, ranges: pd.DataFrame) -> np.ndarray:
    """Per comm range: "gloo (host ranges)" where its process's `ddp.meta` says gloo, else "comm ranges"."""
    backend = {key: str(m.get("backend", "")).lower() for key, m in trace.meta.items()}
    gloo = [backend.get(k) == "gloo" for k in zip(ranges["part"].tolist(), ranges["pid"].tolist(), strict=True)]
    return np.where(np.array(gloo, dtype=bool), family_of_range("gloo"), "comm ranges").astype(object)


def step_at(
    trace: Trace, patterns: Patterns, part: ArrayLike, pid: ArrayLike, t: ArrayLike, steps: pd.DataFrame | None = None
) -> np.ndarray:
    """Number of the step whose window (phases.step_windows: on GPU traces start to next step's start) holds each
    time t of process (part, pid); -1 outside every step. `steps`: the trace's find_steps when the caller has them."""
    part, pid, t = (np.asarray(a, dtype=np.int64) for a in (part, pid, t))
    out = np.full(t.shape, -1, dtype=np.int64)
    steps = steps if steps is not None else find_steps(trace.nvtx, patterns)
    keys, step_keys = process_key(part, pid), process_key(steps["part"], steps["pid"])
    none = np.zeros(0, dtype=np.int64)
    for key in np.unique(step_keys):  # one iteration per process
        windows = step_windows(steps[step_keys == key], len(trace.gpu_ops) > 0, none, none)
        rows = np.flatnonzero(keys == key)
        index = window_index(windows, t[rows])
        out[rows] = np.where(index >= 0, windows["step"].to_numpy()[np.maximum(index, 0)], -1)
    return out


def _phase_at(trace: Trace, patterns: Patterns, part: ArrayLike, pid: ArrayLike, t: np.ndarray) -> np.ndarray:
    """Innermost training phase containing each issue time in its process: grad_sync, optimizer,
    backward, forward; else 'step' inside a step range, else ''."""
    keys = process_key(part, pid)
    out = np.full(len(t), "", dtype=object)
    steps = ranges_named(trace.nvtx, patterns.regex("step"))
    for name, field in (("step", None), *PHASES[::-1]):  # outermost first: inner phases overwrite
        ranges = steps if field is None else ranges_named(trace.nvtx, patterns.regex(field))
        if len(ranges):
            inside = keyed_contains(process_key(ranges["part"], ranges["pid"]), ranges["start"], ranges["end"], keys, t)
            out[inside] = name
    return out


def outside_steps(calls: pd.DataFrame, steps: pd.DataFrame) -> np.ndarray:
    """Per call (part, pid, step): whether it lies outside every step (-1) of a process that has steps
    (`steps`: the trace's phases.find_steps; in a process without step ranges every call is -1 and the whole
    capture is what is measured)."""
    stepped = np.isin(process_key(calls["part"], calls["pid"]), process_key(steps["part"], steps["pid"]))
    return stepped & (calls["step"].to_numpy() < 0)


def call_times(trace: Trace, patterns: Patterns, steps: pd.DataFrame | None = None) -> tuple[pd.DataFrame, str]:
    """(the calls with rank, part, op, step, issue/start/end ns and what else the source gives, but
    no bytes, phase or compute; the source): what clock alignment needs (run/clocks.py). `steps`: as step_at's."""
    kernels = _kernel_calls(trace, patterns) if len(trace.gpu_ops) else pd.DataFrame()
    source = KERNELS if len(kernels) else RANGES
    calls = kernels if source == KERNELS else _range_calls(trace)
    issue = calls["issue_ns"].to_numpy(dtype=np.int64)
    calls["step"] = step_at(trace, patterns, calls["part"], calls["pid"], issue, steps)
    return calls, source


def find_calls(
    trace: Trace,
    patterns: Patterns | None = None,
    works: list[RankWork] | None = None,
    steps: pd.DataFrame | None = None,
) -> Calls:
    """Every collective call per rank with op, tag, bytes, issue/arrival/completion, step and phase;
    `works`: rank_work(trace, patterns) when the caller has it already (the ranks' compute comes from it),
    `steps`: the trace's phases.find_steps likewise (found here otherwise)."""
    patterns = patterns or Patterns()
    steps = steps if steps is not None else find_steps(trace.nvtx, patterns)
    calls, source = call_times(trace, patterns, steps)
    calls["bytes"] = _bytes(calls, trace)
    issue = calls["issue_ns"].to_numpy(dtype=np.int64)
    calls["phase"] = _phase_at(trace, patterns, calls["part"], calls["pid"], issue)
    groups = fold_inferred(group_columns(trace, calls), world_size(trace.meta, len(trace.ranks)))
    calls = pd.concat([calls.drop(columns="group"), groups.set_axis(calls.index)], axis=1)
    calls.loc[outside_steps(calls, steps), "phase"] = OUTSIDE_STEPS
    frame = calls[CALL_COLUMNS].sort_values(["rank", "start_ns"], kind="stable").reset_index(drop=True)
    compute = compute_sets(works if works is not None else rank_work(trace, patterns, steps))
    return Calls(frame=frame, source=source, compute=compute)
