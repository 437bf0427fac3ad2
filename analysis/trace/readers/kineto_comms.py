"""Kineto's collective calls as the `collectives` frame (columns: trace/frames.py COLLECTIVE_COLUMNS).

Kineto traces carry them: PyTorch wraps every c10d collective in a `record_param_comms` CPU op
whose args hold the collective's name, element counts, dtype and process group; on GPUs it puts the
same args on the NCCL kernels, whose sizes (`kernel_bytes`) become gpu_ops.comm_bytes. nsys exports do
not, so their frame is empty (same columns). One row per `record_param_comms` op; `bytes` is
max(in_bytes, out_bytes) (nccl-tests' "size": the full buffer, i.e. the gathered output of all_gather,
the input of reduce_scatter). `wait` rows (PyTorch records its waits the same way) have 0 bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import repeat
from operator import attrgetter, is_not
from typing import Any

import numpy as np
import pandas as pd

from analysis.trace.frames import empty_collectives

ELEMENT_BYTES = {
    "Float": 4,
    "Double": 8,
    "Half": 2,
    "BFloat16": 2,
    "ComplexHalf": 4,
    "ComplexFloat": 8,
    "ComplexDouble": 16,
    "Byte": 1,
    "Char": 1,
    "Bool": 1,
    "Short": 2,
    "Int": 4,
    "Long": 8,
    "UInt16": 2,
    "UInt32": 4,
    "UInt64": 8,
    "Float8_e4m3fn": 1,
    "Float8_e5m2": 1,
    "Float8_e4m3fnuz": 1,
    "Float8_e5m2fnuz": 1,
    "QInt8": 1,
    "QUInt8": 1,
    "QInt32": 4,
}


def _int(value: object) -> int:
    """An element count or group size as recorded (an int, or a numeric string in some versions), else -1."""
    if isinstance(value, bool):
        return -1
    if isinstance(value, int):
        return value
    try:
        return int(str(value))
    except ValueError:
        return -1


def _group(name: object, desc: object) -> str:
    name = "" if name is None else str(name)
    return f"{name}:{desc}" if desc not in (None, "") else name


def _sizes(args: Sequence) -> dict[str, Any]:
    """dtype, element_bytes, in/out_nelems and in/out_bytes (-1 unknown) of each args (collective,
    in_nelems, out_nelems, dtype attributes). One Python pass per collective call: thousands, not millions."""
    dtype = [str(a.dtype) if a.dtype is not None else "" for a in args]
    size = np.array([ELEMENT_BYTES.get(d, 0) for d in dtype], dtype=np.int64)
    n_in = np.array([_int(a.in_nelems) for a in args], dtype=np.int64)
    n_out = np.array([_int(a.out_nelems) for a in args], dtype=np.int64)
    b_in = np.where((n_in >= 0) & (size > 0), n_in * size, -1)
    b_out = np.where((n_out >= 0) & (size > 0), n_out * size, -1)
    return {"dtype": dtype, "size": size, "n_in": n_in, "n_out": n_out, "b_in": b_in, "b_out": b_out}


def kernel_bytes(args: Sequence) -> np.ndarray:
    """Per GPU event's args: the collective's message size in nccl-tests' convention, max(in, out) bytes
    (all-gather: the gathered output; reduce-scatter: the input; all-reduce: the buffer), from the
    `In/Out msg nelems` and `dtype` PyTorch puts on NCCL kernels; -1 for events without them."""
    out = np.full(len(args), -1, dtype=np.int64)
    has = np.fromiter(map(is_not, map(attrgetter("collective"), args), repeat(None)), dtype=bool, count=len(args))
    rows = np.flatnonzero(has)
    if rows.size:
        sizes = _sizes([args[i] for i in rows.tolist()])  # the NCCL kernels only
        out[rows] = np.maximum(sizes["b_in"], sizes["b_out"])
    return out


def collectives_frame(calls: list[tuple[int, tuple]]) -> pd.DataFrame:
    """The frame from (part, (pid, tid, start, end, args)) pairs; args has collective, in_nelems,
    out_nelems, dtype, group_size, pg_name and pg_desc attributes. One Python pass per collective
    call: a trace holds thousands of them, not millions of events."""
    if not calls:
        return empty_collectives()
    part = [p for p, _ in calls]
    pid, tid, start, end, args = zip(*(c for _, c in calls), strict=True)
    sizes = _sizes(args)
    dtype, size, n_in, n_out, b_in, b_out = (sizes[k] for k in ("dtype", "size", "n_in", "n_out", "b_in", "b_out"))
    frame = pd.DataFrame(
        {
            "part": np.array(part, dtype=np.int64),
            "pid": np.array(pid, dtype=np.int64),
            "tid": np.array(tid, dtype=np.int64),
            "start": np.array(start, dtype=np.int64),
            "end": np.array(end, dtype=np.int64),
            "collective": pd.Series(
                [str(a.collective) if a.collective is not None else "" for a in args], dtype=object
            ),
            "dtype": pd.Series(dtype, dtype=object),
            "element_bytes": size,
            "in_nelems": n_in,
            "out_nelems": n_out,
            "in_bytes": b_in,
            "out_bytes": b_out,
            "bytes": np.maximum(b_in, b_out),
            "group_size": np.array([_int(a.group_size) for a in args], dtype=np.int64),
            "process_group": pd.Series([_group(a.pg_name, a.pg_desc) for a in args], dtype=object),
        }
    )
    return frame.sort_values(["part", "pid", "start"], kind="stable").reset_index(drop=True)
