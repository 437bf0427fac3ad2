"""Kineto events (decoded structs, kineto_events.py) to numpy columns by family: GPU work, runtime launches,
ranges, autograd ops, collective calls. C-level passes over the events (attrgetter, itemgetter), no
Python code per event. No pandas: this runs in the workers kineto_parts.py forks before the analysis
imports it, so columns of repeated strings are `Coded` (codes and their strings), not categoricals.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from itertools import chain, repeat
from operator import attrgetter, itemgetter
from typing import TYPE_CHECKING

import numpy as np

from analysis.trace.kinds import GPU_KERNEL, GPU_MEMCPY, GPU_MEMSET
from analysis.trace.readers.kineto_sizes import kernel_bytes
from contract import ASYNC_KIND

if TYPE_CHECKING:
    from analysis.trace.readers.kineto_events import Fields

GPU_CATS = {"kernel": GPU_KERNEL, "gpu_memcpy": GPU_MEMCPY, "gpu_memset": GPU_MEMSET}  # -> gpu_ops kind codes


RUNTIME_CATS = ("cuda_runtime", "cuda_driver")


ANNOTATION_CAT = "user_annotation"


PROFILER_STEP = "ProfilerStep#"


AUTOGRAD_OP = "autograd::engine::evaluate_function: "


COMMS_OP = "record_param_comms"


EXACT_FLOAT_US = 2.0**43  # below this a float64 µs value is within 0.49 ns of its decimal text: ns are exact
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


def field_values(events: Sequence[Fields], name: str) -> list:
    return list(map(attrgetter(name), events))  # a C-level pass: no Python code per event


def _int_field(events: Sequence[Fields], name: str, default: int = -1) -> np.ndarray:
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


def take(events: Sequence[Fields], rows: np.ndarray) -> list:
    """events[rows] for an index array, in one C-level call."""
    if rows.size == 0:
        return []
    got = itemgetter(*rows.tolist())(events)
    return list(got) if rows.size > 1 else [got]


@dataclass(frozen=True, eq=False)
class Coded:
    """A column of repeated strings: row i holds uniques[codes[i]]; uniques in order of first appearance."""

    codes: np.ndarray  # int32
    uniques: list[str]

    def values(self) -> np.ndarray:
        """The column as an array of strings (objects)."""
        return np.array(self.uniques, dtype=object)[self.codes] if self.uniques else np.zeros(0, dtype=object)


def coded(values: Sequence[str]) -> Coded:
    """values as a Coded column: two C-level passes, hashing each string once."""
    uniques = list(dict.fromkeys(values))
    index = {u: i for i, u in enumerate(uniques)}
    return Coded(np.fromiter(map(index.__getitem__, values), dtype=np.int32, count=len(values)), uniques)


def _by_value(values: list) -> dict:
    """{value: row indices} for a column of a few distinct strings."""
    column = coded(values)
    order = np.argsort(column.codes, kind="stable")
    bounds = np.searchsorted(column.codes[order], np.arange(len(column.uniques) + 1))
    return {u: order[bounds[i] : bounds[i + 1]] for i, u in enumerate(column.uniques)}


def _rows_named(by_name: dict, test: Callable[[str], bool]) -> np.ndarray:
    rows = [r for name, r in by_name.items() if test(name)]
    return np.sort(np.concatenate(rows)) if rows else np.zeros(0, dtype=np.int64)


def batch_columns(complete: list) -> dict:
    """Columns of one batch of complete events, by family (see KinetoFile)."""
    by_cat = _by_value(field_values(complete, "cat"))
    pick = lambda cats: take(complete, np.sort(np.concatenate([by_cat.get(c, np.zeros(0, np.int64)) for c in cats])))

    gpu_rows = [by_cat.get(c, np.zeros(0, np.int64)) for c in GPU_CATS]
    gpu_events = take(complete, np.concatenate(gpu_rows))
    args = field_values(gpu_events, "args")
    device, stream = _int_field(args, "device"), _int_field(args, "stream")
    start, end = _times(gpu_events)
    kinds = zip(gpu_rows, GPU_CATS.values(), strict=True)
    gpu = {
        "kind": np.concatenate([np.full(r.size, k, dtype=np.int8) for r, k in kinds]),
        "name": coded(field_values(gpu_events, "name")),  # codes: a piece's workers send few strings
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
    steps = take(cpu_ops, _rows_named(by_name, lambda n: n.startswith(PROFILER_STEP)))  # older torch: cpu_ops
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

    ops = take(cpu_ops, _rows_named(by_name, lambda n: n.startswith(AUTOGRAD_OP)))
    start, end = _times(ops)
    autograd = {"pid": _int_field(ops, "pid"), "tid": _int_field(ops, "tid"), "start": start, "end": end}

    calls = take(cpu_ops, _rows_named(by_name, lambda n: n == COMMS_OP))
    start, end = _times(calls)
    comms = list(
        zip(
            field_values(calls, "pid"),
            field_values(calls, "tid"),
            start.tolist(),
            end.tolist(),
            field_values(calls, "args"),
            strict=True,
        )
    )
    return {
        "gpu": gpu,
        "runtime": runtime,
        "ranges": ranges,
        "autograd": autograd,
        "comms": comms,
        "sampled_pids": _int_field(cpu_ops[:1000], "pid"),
    }


_FAMILIES = ("gpu", "runtime", "ranges", "autograd")  # the batches' dicts of columns


def joined(batches: list[dict]) -> dict:
    """The batches' columns as one batch's, in order (Coded columns keep their strings' order of appearance;
    the sampled pids are the first batch's)."""
    if len(batches) == 1:
        return batches[0]
    out = {f: {k: _join([b[f][k] for b in batches]) for k in batches[0][f]} for f in _FAMILIES}
    return {**out, "comms": [c for b in batches for c in b["comms"]], "sampled_pids": batches[0]["sampled_pids"]}


def _join(columns: list) -> list | np.ndarray | Coded:
    if isinstance(columns[0], list):
        return list(chain.from_iterable(columns))
    if isinstance(columns[0], Coded):
        return _join_coded(columns)
    return np.concatenate(columns)


def _join_coded(columns: list[Coded]) -> Coded:
    """Coded columns one after the other, each one's codes mapped onto the union of their strings."""
    uniques = list(dict.fromkeys(chain.from_iterable(c.uniques for c in columns)))
    index = {u: i for i, u in enumerate(uniques)}
    mapped = [np.array([index[u] for u in c.uniques], dtype=np.int32)[c.codes] for c in columns if c.uniques]
    return Coded(np.concatenate(mapped) if mapped else np.zeros(0, dtype=np.int32), uniques)
