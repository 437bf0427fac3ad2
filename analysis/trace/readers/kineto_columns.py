"""Kineto events (decoded structs, kineto_events.py) to numpy columns by family: GPU work, runtime launches,
ranges, autograd ops, collective calls; and the collectives' message sizes. C-level passes over the
events (attrgetter, itemgetter), no Python code per event.

Times: Kineto writes microseconds (float, 3 decimals) after `baseTimeNanoseconds`; columns hold int64
ns. Below 2**43 µs (101 days) a float64 lies within 0.49 ns of its decimal text, and integral and
fractional µs are scaled to ns apart (`_ns`); larger timestamps come decoded as decimals (`_exact_ns`).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from decimal import Decimal
from itertools import chain, repeat
from operator import attrgetter, is_not, itemgetter
from typing import Any

import numpy as np
import pandas as pd

from analysis.trace.frames import GPU_KERNEL, GPU_MEMCPY, GPU_MEMSET
from analysis.trace.readers.kineto_events import Fields
from contract import ASYNC_KIND

GPU_CATS = {"kernel": GPU_KERNEL, "gpu_memcpy": GPU_MEMCPY, "gpu_memset": GPU_MEMSET}  # -> gpu_ops kind codes
RUNTIME_CATS = ("cuda_runtime", "cuda_driver")
ANNOTATION_CAT = "user_annotation"
PROFILER_STEP = "ProfilerStep#"
AUTOGRAD_OP = "autograd::engine::evaluate_function: "
COMMS_OP = "record_param_comms"

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
_THOUSAND = Decimal(1000)


def _ns(us: np.ndarray) -> np.ndarray:
    """float64 µs to int64 ns: integral and fractional parts scaled apart, so nothing is lost to a product at
    ~1e18 (float64 at 1.7e18 ns rounds to 256 ns). Exact for |us| < EXACT_FLOAT_US; beyond, read decimals."""
    us = np.asarray(us, dtype=np.float64)
    whole = np.floor(us)
    return whole.astype(np.int64) * 1000 + np.rint((us - whole) * 1000.0).astype(np.int64)


def _exact_ns(us: list) -> np.ndarray:
    """Decimal µs (as written in the JSON) to int64 ns, rounded to the ns: C-level passes, no code per event."""
    scaled = map(round, map(operator.mul, us, repeat(_THOUSAND)))
    return np.fromiter(scaled, dtype=np.int64, count=len(us))


def _ns_field(events: Sequence[Fields], name: str) -> np.ndarray:
    """A time field in int64 ns; events decoded exactly (Decimal fields) keep every digit."""
    if events and isinstance(getattr(events[0], name), Decimal):
        return _exact_ns(field_values(events, name))
    return _ns(np.fromiter(map(attrgetter(name), events), dtype=np.float64, count=len(events)))  # one pass, no list


def field_values(events: Sequence[Any], name: str) -> list:
    return list(map(attrgetter(name), events))  # a C-level pass: no Python code per event


def _int_field(events: Sequence[Any], name: str, default: int = -1) -> np.ndarray:
    """An integer field; values that are not integers (Chrome's named pids, "Spans") become default."""
    try:
        return np.fromiter(map(attrgetter(name), events), dtype=np.int64, count=len(events))
    except (TypeError, ValueError, OverflowError):
        return np.array([v if isinstance(v, int) else default for v in field_values(events, name)], dtype=np.int64)


def _or_field(values: np.ndarray, events: Sequence[Fields], name: str) -> np.ndarray:
    """values, with the events' `name` field where a value is missing (-1); that field is read only then."""
    missing = values < 0
    return np.where(missing, _int_field(events, name), values) if missing.any() else values


def _times(events: Sequence[Fields]) -> tuple[np.ndarray, np.ndarray]:
    start = _ns_field(events, "ts")
    return start, start + np.maximum(_ns_field(events, "dur"), 0)


def _take(events: Sequence[Fields], rows: np.ndarray) -> list:
    """events[rows] for an index array, in one C-level call."""
    if rows.size == 0:
        return []
    got = itemgetter(*rows.tolist())(events)
    return list(got) if rows.size > 1 else [got]


def _categorical(values: list[str]) -> pd.Categorical:
    """A column of repeated strings, its categories in order of first appearance (each string hashed once)."""
    codes, uniques = pd.factorize(np.array(values, dtype=object))
    return pd.Categorical.from_codes(codes, categories=pd.Index(uniques, dtype=object))


def _by_value(values: list[str]) -> dict[str, np.ndarray]:
    """{value: row indices} for a column of a few distinct strings."""
    column = _categorical(values)
    order = np.argsort(column.codes, kind="stable")
    bounds = np.searchsorted(column.codes[order], np.arange(len(column.categories) + 1))
    return {u: order[bounds[i] : bounds[i + 1]] for i, u in enumerate(column.categories)}


def _rows_named(by_name: dict, test: Callable[[str], bool]) -> np.ndarray:
    rows = [r for name, r in by_name.items() if test(name)]
    return np.sort(np.concatenate(rows)) if rows else np.zeros(0, dtype=np.int64)


def batch_columns(complete: list) -> dict:
    """Columns of one batch of complete events, by family (see kineto_json.KinetoFile)."""
    by_cat = _by_value(field_values(complete, "cat"))
    none = np.zeros(0, np.int64)
    pick = lambda cats: _take(complete, np.sort(np.concatenate([by_cat.get(c, none) for c in cats])))

    gpu_rows = [by_cat.get(c, none) for c in GPU_CATS]
    gpu_events = _take(complete, np.concatenate(gpu_rows))
    args = field_values(gpu_events, "args")
    device, stream = _int_field(args, "device"), _int_field(args, "stream")
    start, end = _times(gpu_events)
    kinds = zip(gpu_rows, GPU_CATS.values(), strict=True)
    gpu = {
        "kind": np.concatenate([np.full(r.size, k, dtype=np.int8) for r, k in kinds]),
        "name": _categorical(field_values(gpu_events, "name")),  # a batch's names: a few strings, many codes
        "device": _or_field(device, gpu_events, "pid"),
        "stream": _or_field(stream, gpu_events, "tid"),
        "start": start,
        "end": end,
        "correlation": _int_field(args, "correlation"),
        "comm_bytes": kernel_bytes(args),  # NCCL kernels' message size from their args, else -1
    }

    launches = pick(RUNTIME_CATS)
    runtime = {
        "pid": _int_field(launches, "pid"),
        "tid": _int_field(launches, "tid"),
        "start": _ns_field(launches, "ts"),
        "correlation": _int_field(field_values(launches, "args"), "correlation"),
    }

    cpu_ops = pick(["cpu_op"])
    by_name = _by_value(field_values(cpu_ops, "name"))
    steps = _take(cpu_ops, _rows_named(by_name, lambda n: n.startswith(PROFILER_STEP)))  # older torch: cpu_ops
    annotations = pick([ANNOTATION_CAT]) + steps
    start, end = _times(annotations)
    ranges = {
        "pid": _int_field(annotations, "pid"),
        "tid": _int_field(annotations, "tid"),
        "start": start,
        "end": end,
        "text": field_values(annotations, "name"),
        "async": np.array(field_values(field_values(annotations, "args"), "kind"), dtype=object) == ASYNC_KIND,
        "payload": _int_field(field_values(annotations, "args"), "payload"),  # our recorder's, else -1
    }

    ops = _take(cpu_ops, _rows_named(by_name, lambda n: n.startswith(AUTOGRAD_OP)))
    start, end = _times(ops)
    autograd = {"pid": _int_field(ops, "pid"), "tid": _int_field(ops, "tid"), "start": start, "end": end}

    calls = _take(cpu_ops, _rows_named(by_name, lambda n: n == COMMS_OP))
    start, end = _times(calls)
    comms = {
        "pid": _int_field(calls, "pid"),
        "tid": _int_field(calls, "tid"),
        "start": start,
        "end": end,
        "args": field_values(calls, "args"),  # the collective's names and sizes: kineto.py reads them
    }
    return {
        "gpu": gpu,
        "runtime": runtime,
        "ranges": ranges,
        "autograd": autograd,
        "comms": comms,
        "sampled_pids": _int_field(cpu_ops[:1000], "pid"),
    }


def joined(batches: list[dict]) -> dict:
    """The batches' columns as one batch's, in order (categorical columns keep their strings' order of
    appearance; the sampled pids are the first batch's)."""
    if len(batches) == 1:
        return batches[0]
    families = ("gpu", "runtime", "ranges", "autograd", "comms")
    out = {f: {k: _join([b[f][k] for b in batches]) for k in batches[0][f]} for f in families}
    return {**out, "sampled_pids": batches[0]["sampled_pids"]}


def _join(columns: list) -> list | np.ndarray | pd.Categorical:
    if isinstance(columns[0], list):
        return list(chain.from_iterable(columns))
    if isinstance(columns[0], pd.Categorical):
        return pd.api.types.union_categoricals(columns, sort_categories=False)
    return np.concatenate(columns)


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
