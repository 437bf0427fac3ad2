"""Parse one Kineto trace (torch.profiler Chrome-trace JSON, `.json` or `.json.gz`) into columns.

JSON parsing is the whole cost of reading these files, so msgspec decodes straight into small typed
structs: complete (`ph: "X"`) events keep only the fields the analysis reads, every other phase
(flows, metadata, instants, counters) decodes to an empty struct, and unknown keys are skipped
without building Python objects. To bound memory, the event list is decoded in batches of about
16 MB of text, each turned into numpy columns and dropped before the next: the top level is decoded
first with the event array kept as one raw (validated, not built) slice, which is then cut after
the `}` of an event followed by `,` and `{`. A cut that falls inside a string or a nested object
leaves that batch unbalanced, so its decode fails, and the batch is extended to the next cut. A
batch whose events do not fit the fast types (an unusual phase, say) is decoded again leniently.

Times: Kineto writes microseconds (float, 3 decimals) after `baseTimeNanoseconds` (absent in old
traces, whose timestamps are absolute); columns hold int64 ns on the file's own clock and
`clock_offset` is baseTimeNanoseconds, so files of one job line up like nsys exports do.
"""
from __future__ import annotations

import functools
import gzip
import operator
import re
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from itertools import chain, repeat
from operator import attrgetter, is_, itemgetter
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pandas as pd

from analysis.errors import TraceError
from contract import ASYNC_KIND, ASYNC_KIND_KEY, META_KEY

GZIP_MAGIC = b"\x1f\x8b"
GPU_CATS = {"kernel": 0, "gpu_memcpy": 1, "gpu_memset": 2}  # -> gpu_ops kind codes (trace.GPU_KINDS)
RUNTIME_CATS = ("cuda_runtime", "cuda_driver")
ANNOTATION_CAT = "user_annotation"
PROFILER_STEP = "ProfilerStep#"
AUTOGRAD_OP = "autograd::engine::evaluate_function: "
COMMS_OP = "record_param_comms"


class Args(msgspec.Struct, gc=False):
    """The `args` keys read; the rest are skipped while decoding."""

    correlation: int = -1
    device: int = -1
    stream: int = -1
    kind: str = msgspec.field(name=ASYNC_KIND_KEY, default="")  # ASYNC_KIND: an async range of our runner
    collective: Any = msgspec.field(name="Collective name", default=None)
    in_nelems: Any = msgspec.field(name="In msg nelems", default=None)
    out_nelems: Any = msgspec.field(name="Out msg nelems", default=None)
    dtype: Any = None
    group_size: Any = msgspec.field(name="Group size", default=None)
    pg_name: Any = msgspec.field(name="Process Group Name", default=None)
    pg_desc: Any = msgspec.field(name="Process Group Description", default=None)


class _Fields(msgspec.Struct, gc=False):
    cat: str = ""
    name: str = ""
    pid: int | str = -1
    tid: int | str = -1
    ts: float = 0.0
    dur: float = 0.0
    args: Args = msgspec.field(default_factory=Args)


class Complete(_Fields, gc=False, tag="X", tag_field="ph"):
    """A complete event ("ph": "X"): everything this analysis reads is one."""


class AnyPhase(_Fields, gc=False):
    """The lenient form: any phase, as a plain field."""

    ph: str = ""


# Every other phase of the Chrome trace event format: nothing of them is kept.
_SKIPPED = tuple(msgspec.defstruct(f"Skip_{ord(c)}", [], tag=c, tag_field="ph", gc=False)
                 for c in "BEiICbnestfPONDMRcpvV()")


class _Top(msgspec.Struct, kw_only=True):
    baseTimeNanoseconds: int = 0
    schemaVersion: Any = None
    distributedInfo: Any = None
    ddp_meta: Any = msgspec.field(name=META_KEY, default=None)
    deviceProperties: Any = None
    host_name: Any = None


class RawFile(_Top):
    traceEvents: msgspec.Raw


BATCH_BYTES = 16 * 2**20  # event text decoded at a time
_CUT = re.compile(rb"\}\s*,\s*\{")
# Complete | Skip_66 | ...: built at run time from the phases, so typed Any (no static type names it)
_FAST_EVENT: Any = functools.reduce(operator.or_, _SKIPPED, Complete)
_FAST = msgspec.json.Decoder(list[_FAST_EVENT])
_LENIENT = msgspec.json.Decoder(list[AnyPhase])


@dataclass
class KinetoFile:
    """One file's content as columns (times int64 ns on the file's clock)."""

    path: Path
    clock_offset: int
    schema: str
    distributed: dict
    meta: dict
    info: dict       # as trace.Trace.info: {"gpus": {device id: {name, uuid}}, "hostname"} where recorded
    gpu: dict        # kind, name (list), device, stream, start, end, correlation
    runtime: dict    # pid, tid, start, correlation
    ranges: dict     # pid, tid, start, end, text (list), async (bool)
    autograd: dict   # pid, tid, start, end: autograd engine ops (the backward pass of anyone's code)
    comms: list      # (pid, tid, start, end, Args) of record_param_comms ops
    host_pids: np.ndarray


def is_kineto(path: Path) -> bool:
    """True when the file looks like JSON (gzipped or not): the first non-blank byte is `{` or `[`."""
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
            if head[:2] == GZIP_MAGIC:
                return True
    except OSError:
        return False  # the nsys reader reports a missing or unreadable path
    return head.lstrip()[:1] in (b"{", b"[")


def _read_bytes(path: Path) -> bytes:
    try:
        data = path.read_bytes()
        return gzip.decompress(data) if data[:2] == GZIP_MAGIC else data
    except (EOFError, gzip.BadGzipFile, zlib.error) as e:
        raise TraceError(f"{path}: truncated or corrupt gzip file ({e})") from None
    except OSError as e:
        raise TraceError(f"{path}: cannot read ({e.strerror or e})") from None


def _decode_top(path: Path, data: bytes) -> RawFile:
    """The top-level keys, the events as one raw slice of `data` (validates the whole JSON)."""
    try:
        return msgspec.json.decode(data, type=RawFile)
    except msgspec.ValidationError as e:
        raise TraceError(f"{path}: JSON but not a torch.profiler (Kineto) trace ({e})") from None
    except msgspec.DecodeError as e:
        raise TraceError(f"{path}: not valid JSON ({e})") from None


def _event_batches(path: Path, data: bytes, events: msgspec.Raw) -> Iterator[list]:
    """The complete events of the event array (a raw slice of data), decoded batch by batch."""
    view = np.frombuffer(events, dtype=np.uint8)
    first = view.ctypes.data - np.frombuffer(data, dtype=np.uint8).ctypes.data  # the slice's place in data
    if not 0 <= first <= len(data) - view.size:  # a copy, not a view: use it as it is
        data, first = bytes(events), 0
    last = first + view.size - 1  # its closing "]"
    if data[first:first + 1] != b"[" or data[last:last + 1] != b"]":
        raise TraceError(f"{path}: JSON but not a torch.profiler (Kineto) trace (traceEvents is not an array)")
    start = first + 1
    while True:
        cut = _CUT.search(data, min(start + BATCH_BYTES, last), last)
        while True:
            end = cut.start() + 1 if cut else last
            try:
                complete = _complete_events(path, b"".join((b"[", memoryview(data)[start:end], b"]")))  # one copy
                break
            except msgspec.DecodeError:  # the cut fell inside a string or a nested object
                if cut is None:
                    raise TraceError(f"{path}: not valid JSON (in traceEvents)") from None
                cut = _CUT.search(data, cut.end(), last)
        yield complete
        if cut is None:
            return
        start = cut.end() - 1  # the "{" of the next event


def _complete_events(path: Path, batch: bytes) -> list:
    """The complete events of a batch of events, decoded."""
    try:
        events = _FAST.decode(batch)
        return _take(events, np.flatnonzero(
            np.fromiter(map(is_, map(type, events), repeat(Complete)), dtype=bool, count=len(events))))
    except msgspec.ValidationError:
        pass  # events that do not fit the fast types: try the lenient ones, for a precise message
    try:
        events = _LENIENT.decode(batch)
    except msgspec.ValidationError as e:
        raise TraceError(f"{path}: JSON but not a torch.profiler (Kineto) trace (an event: {e})") from None
    return _take(events, np.flatnonzero(np.array(_field(events, "ph"), dtype=object) == "X"))


def _ns(us: np.ndarray) -> np.ndarray:
    return np.rint(np.asarray(us, dtype=np.float64) * 1000.0).astype(np.int64)


def _field(events: Sequence[_Fields], name: str) -> list:
    return list(map(attrgetter(name), events))  # a C-level pass: no Python code per event


def _floats(events: Sequence[_Fields], name: str) -> np.ndarray:
    return np.fromiter(map(attrgetter(name), events), dtype=np.float64, count=len(events))


def _int_field(events: Sequence[_Fields], name: str, default: int = -1) -> np.ndarray:
    """An integer field; values that are not integers (Chrome's named pids, "Spans") become default."""
    try:
        return np.fromiter(map(attrgetter(name), events), dtype=np.int64, count=len(events))
    except (TypeError, ValueError, OverflowError):
        return np.array([v if isinstance(v, int) else default for v in _field(events, name)], dtype=np.int64)


def _times(events: Sequence[_Fields]) -> tuple[np.ndarray, np.ndarray]:
    start = _ns(_floats(events, "ts"))
    return start, start + np.maximum(_ns(_floats(events, "dur")), 0)


def _take(events: Sequence[_Fields], rows: np.ndarray) -> list:
    """events[rows] for an index array, in one C-level call."""
    if rows.size == 0:
        return []
    got = itemgetter(*rows.tolist())(events)
    return list(got) if rows.size > 1 else [got]


def _by_value(values: list) -> dict:
    """{value: row indices} for a column of a few distinct strings."""
    codes, uniques = pd.factorize(np.array(values, dtype=object))
    order = np.argsort(codes, kind="stable")
    bounds = np.searchsorted(codes[order], np.arange(len(uniques) + 1))
    return {u: order[bounds[i]:bounds[i + 1]] for i, u in enumerate(uniques)}


def _rows_named(by_name: dict, test: Callable[[str], bool]) -> np.ndarray:
    rows = [r for name, r in by_name.items() if test(name)]
    return np.sort(np.concatenate(rows)) if rows else np.zeros(0, dtype=np.int64)


def _batch_columns(complete: list) -> dict:
    """Columns of one batch of complete events, by family (see KinetoFile)."""
    by_cat = _by_value(_field(complete, "cat"))
    pick = lambda cats: _take(complete, np.sort(np.concatenate([by_cat.get(c, np.zeros(0, np.int64))
                                                                for c in cats])))

    gpu_rows = [by_cat.get(c, np.zeros(0, np.int64)) for c in GPU_CATS]
    gpu_events = _take(complete, np.concatenate(gpu_rows))
    args = _field(gpu_events, "args")
    device, stream = _int_field(args, "device"), _int_field(args, "stream")
    start, end = _times(gpu_events)
    kinds = zip(gpu_rows, GPU_CATS.values(), strict=True)
    gpu = {"kind": np.concatenate([np.full(r.size, k, dtype=np.int8) for r, k in kinds]),
           "name": _field(gpu_events, "name"),
           "device": np.where(device >= 0, device, _int_field(gpu_events, "pid")),
           "stream": np.where(stream >= 0, stream, _int_field(gpu_events, "tid")),
           "start": start, "end": end, "correlation": _int_field(args, "correlation")}

    launches = pick(RUNTIME_CATS)
    runtime = {"pid": _int_field(launches, "pid"), "tid": _int_field(launches, "tid"),
               "start": _ns(_floats(launches, "ts")),
               "correlation": _int_field(_field(launches, "args"), "correlation")}

    cpu_ops = pick(["cpu_op"])
    by_name = _by_value(_field(cpu_ops, "name"))
    steps = _take(cpu_ops, _rows_named(by_name, lambda n: n.startswith(PROFILER_STEP)))  # older torch: cpu_ops
    annotations = pick([ANNOTATION_CAT]) + steps
    start, end = _times(annotations)
    ranges = {"pid": _int_field(annotations, "pid"), "tid": _int_field(annotations, "tid"),
              "start": start, "end": end, "text": _field(annotations, "name"),
              "async": np.array(_field(_field(annotations, "args"), "kind"), dtype=object) == ASYNC_KIND}

    ops = _take(cpu_ops, _rows_named(by_name, lambda n: n.startswith(AUTOGRAD_OP)))
    start, end = _times(ops)
    autograd = {"pid": _int_field(ops, "pid"), "tid": _int_field(ops, "tid"), "start": start, "end": end}

    calls = _take(cpu_ops, _rows_named(by_name, lambda n: n == COMMS_OP))
    start, end = _times(calls)
    comms = list(zip(_field(calls, "pid"), _field(calls, "tid"), start.tolist(), end.tolist(), _field(calls, "args"),
                     strict=True))
    return {"gpu": gpu, "runtime": runtime, "ranges": ranges, "autograd": autograd, "comms": comms,
            "sampled_pids": _int_field(cpu_ops[:1000], "pid")}


def _joined(batches: list[dict], family: str) -> dict:
    parts = [b[family] for b in batches]
    return {k: list(chain.from_iterable(p[k] for p in parts)) if isinstance(parts[0][k], list)
            else np.concatenate([p[k] for p in parts]) for k in parts[0]}


def _info(doc: RawFile) -> dict:
    """The machine as the trace describes it: GPUs from deviceProperties, the host name."""
    gpus = [d for d in doc.deviceProperties or [] if isinstance(d, dict) and isinstance(d.get("id"), int)]
    info: dict = {}
    if gpus:
        info["gpus"] = {d["id"]: {"name": str(d.get("name", "")), "uuid": d.get("uuid")} for d in gpus}
    if doc.host_name:
        info["hostname"] = str(doc.host_name)
    return info


def read_kineto(path: Path) -> KinetoFile:
    """Decode `path` into a KinetoFile (TraceError with a one-line reason when it is not one)."""
    data = _read_bytes(path)
    doc = _decode_top(path, data)
    batches = [_batch_columns(complete) for complete in _event_batches(path, data, doc.traceEvents)]
    del data
    doc.traceEvents = msgspec.Raw()  # the raw slice kept data alive
    gpu, runtime, ranges, autograd = (_joined(batches, f) for f in ("gpu", "runtime", "ranges", "autograd"))
    comms = [c for b in batches for c in b["comms"]]
    sampled = batches[0]["sampled_pids"]

    # the process(es) recorded: what launched GPU work, opened ranges or ran ops (a sample of those)
    host = np.concatenate([runtime["pid"], ranges["pid"], autograd["pid"], sampled])
    host_pids, counts = np.unique(host[host >= 0], return_counts=True)
    return KinetoFile(path=path, clock_offset=int(doc.baseTimeNanoseconds or 0),
                      schema=str(doc.schemaVersion) if doc.schemaVersion is not None else "unknown",
                      distributed=doc.distributedInfo if isinstance(doc.distributedInfo, dict) else {},
                      meta=doc.ddp_meta if isinstance(doc.ddp_meta, dict) else {}, info=_info(doc),
                      gpu=gpu, runtime=runtime, ranges=ranges, autograd=autograd, comms=comms,
                      host_pids=host_pids[np.argsort(-counts, kind="stable")])
