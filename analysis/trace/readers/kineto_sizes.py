"""Collective message sizes from Kineto's args: element counts times the dtype's size. Pandas-free: the
Kineto decode (kineto_columns.py) runs in workers forked before pandas is imported; kineto_comms.py
builds the `collectives` frame from the same rules."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import repeat
from operator import attrgetter, is_not
from typing import Any

import numpy as np

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


def count(value: object) -> int:
    """An element count or group size as recorded (an int, or a numeric string in some versions), else -1."""
    if isinstance(value, bool):
        return -1
    if isinstance(value, int):
        return value
    try:
        return int(str(value))
    except ValueError:
        return -1


def group_name(name: object, desc: object) -> str:
    name = "" if name is None else str(name)
    return f"{name}:{desc}" if desc not in (None, "") else name


def sizes(args: Sequence) -> dict[str, Any]:
    """dtype, element_bytes, in/out_nelems and in/out_bytes (-1 unknown) of each args (collective,
    in_nelems, out_nelems, dtype attributes). One Python pass per collective call: thousands, not millions."""
    dtype = [str(a.dtype) if a.dtype is not None else "" for a in args]
    size = np.array([ELEMENT_BYTES.get(d, 0) for d in dtype], dtype=np.int64)
    n_in = np.array([count(a.in_nelems) for a in args], dtype=np.int64)
    n_out = np.array([count(a.out_nelems) for a in args], dtype=np.int64)
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
        found = sizes([args[i] for i in rows.tolist()])  # the NCCL kernels only
        out[rows] = np.maximum(found["b_in"], found["b_out"])
    return out
