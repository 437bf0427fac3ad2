"""The typed frames every reader produces: `Trace` (nsys SQLite and torch.profiler JSON alike).

Frames (all times int64 ns; as read, each part on its own file's clock; run/clocks.py puts
the parts of a loaded run on the first file's clock, from each part's recorded offset):

`gpu_ops`  one row per kernel / memcpy / memset, sorted by (part, pid, device, start):
    part (int, index of the source file), pid, device, stream, start, end (the identifiers pid,
    correlation_id and launch_tid are int32 where every value fits, else int64; part, device and stream
    the smallest integer type holding them, int8 mostly: with the int64 times they are what a kernel
    costs in memory; trace/build_frames.NARROW_COLUMNS, SMALLEST_COLUMNS),
    name (categorical: kernel short name, "memcpy HtoD", "memset", ...),
    kind (categorical GPU_KINDS: kernel | memcpy | memset), correlation_id (-1 if NULL),
    launch_start, launch_tid (the CUDA runtime call with the same correlationId in the same
    process: its start and OS thread id; -1 when none matched), comm_bytes (a collective kernel's
    message size as the file records it: Kineto's NCCL kernel args, max(in, out) bytes; -1 when not
    recorded, always in nsys exports; the smallest integer type holding the values, int8 when all are
    -1: merge.smallest_int), is_comm (bool: which work is
    communication, classified once by measure/phases.communication_mask when the trace is loaded).
`nvtx`     one row per NVTX range or mark (push/pop, start/end, mark), sorted by (part, pid, start):
    part, pid, tid (OS thread that opened it), end_tid (thread that closed it), start, end
    (end == start for marks), text, kind (categorical NVTX_KIND_NAMES: push_pop | start_end | mark),
    domain (domain name, "" for the default domain), payload (the range's integer payload; -1 when none).
`ranks`    one row per rank, sorted by rank: rank, part, pid, device (-1 for NVTX-only traces),
    implementation. A rank is a (process, device) pair with GPU work; rank numbers come from the
    `ddp.meta {json}` mark of our runner when present, else from device order (trace/build_frames.py).
`meta`     {(part, pid): dict parsed from the `ddp.meta` mark}.
`info`     {part: what the file says about its machine: GPUs by device id with name and uuid, driver,
    CUDA driver, hostname, nsys version; and the file's clock offset, UTC ns minus trace-clock ns
    (nsys TARGET_INFO_SESSION_START_TIME, Kineto baseTimeNanoseconds), under CLOCK_OFFSET_KEY}.
`collectives` one row per collective call with its message sizes (COLLECTIVE_COLUMNS below; Kineto
    traces fill it, nsys exports leave it empty).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

NS_PER_MS = 1e6  # frame times are int64 ns; figures are reported in ms
CLOCK_OFFSET_KEY = "clock_offset_ns"  # in a part's `info`: UTC ns minus that file's trace-clock ns
CLOCK_NOTE_KEY = "clock_note"  # in info[0] of a run of several files: how their clocks were aligned
# What a figure was measured from, the one meaning of `source` everywhere (Trace.source, the collective
# calls' source, a rank's comm_source and compute_source): GPU kernels, or NVTX/annotation ranges.
KERNELS, RANGES = "kernels", "ranges"
# gpu_ops.kind categories and their codes
GPU_KINDS = pd.Index(["kernel", "memcpy", "memset"], dtype=object)
GPU_KERNEL, GPU_MEMCPY, GPU_MEMSET = range(len(GPU_KINDS))
# nvtx.kind categories and their codes
NVTX_KIND_NAMES = pd.Index(["push_pop", "start_end", "mark"], dtype=object)
NVTX_PUSH_POP, NVTX_START_END, NVTX_MARK = range(len(NVTX_KIND_NAMES))

# The `collectives` frame, one row per collective call (sorted by part, pid, start):
#   part, pid, tid, start, end   the CPU op (int64 ns on the trace's clock, like the other frames)
#   collective      "allreduce", "broadcast", "allgather", "reduce_scatter", "wait", ... as PyTorch names it
#   dtype           PyTorch's scalar type name ("Float", "BFloat16", ...)
#   element_bytes   bytes per element (0 when the dtype is unknown)
#   in_nelems, out_nelems   elements of the input and output message (-1 when not recorded)
#   in_bytes, out_bytes     the same in bytes (-1 when unknown)
#   bytes           the collective's message size: max(in_bytes, out_bytes) (nccl-tests' "size")
#   group_size      ranks in the process group (-1 when not recorded)
#   process_group   the group's name and, after a colon, its description when recorded ("0:default_pg")
#   group_name, group_desc   the group's name and description apart ("" when not recorded)
#   group_ranks     the group's members, global ranks as "0,1" ("" when not recorded)
COLLECTIVE_COLUMNS = [
    "part",
    "pid",
    "tid",
    "start",
    "end",
    "collective",
    "dtype",
    "element_bytes",
    "in_nelems",
    "out_nelems",
    "in_bytes",
    "out_bytes",
    "bytes",
    "group_size",
    "process_group",
    "group_name",
    "group_desc",
    "group_ranks",
]
COLLECTIVE_INT_COLUMNS = [
    "part",
    "pid",
    "tid",
    "start",
    "end",
    "element_bytes",
    "in_nelems",
    "out_nelems",
    "in_bytes",
    "out_bytes",
    "bytes",
    "group_size",
]


def empty_collectives() -> pd.DataFrame:
    """The collectives frame with its columns and no rows (nsys traces)."""
    return pd.DataFrame(
        {c: pd.Series(dtype=np.int64 if c in COLLECTIVE_INT_COLUMNS else object) for c in COLLECTIVE_COLUMNS}
    )


@dataclass(frozen=True)
class Trace:
    """One analysed unit: a single file, or several one-rank files of one job merged (see module docstring)."""

    path: str
    profiler: str  # what recorded it: "nsys" (an nsys export) or "torch.profiler" (a Kineto trace)
    profiler_version: str | None  # nsys: the exporting nsys; torch.profiler: torch's, as ddp.meta recorded it
    source: str  # KERNELS when the trace has GPU activity, else RANGES (a CPU run: measured from its ranges)
    gpu_ops: pd.DataFrame
    nvtx: pd.DataFrame
    ranks: pd.DataFrame
    meta: dict = field(default_factory=dict)
    implementation: str = ""
    info: dict = field(default_factory=dict)
    collectives: pd.DataFrame = field(default_factory=empty_collectives)
