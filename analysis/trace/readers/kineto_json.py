"""Read one Kineto trace file (torch.profiler Chrome-trace JSON, `.json` or `.json.gz`) into columns:
`read_kineto(path) -> KinetoFile`.

Uncompressed files are memory-mapped; the event array is decoded batch by batch (kineto_events.py)
and each batch turned into columns (kineto_columns.py) before the next, so memory holds the columns
and one batch of events, not the file's events.

A large mapped file's event text is cut at event boundaries into pieces (one per usable core, at most
MAX_PIECES, none under PIECE_BYTES) that forked processes decode; the columns come back in file order,
so they are the serial decode's. This process decodes none: its memory holds the columns, not a batch's
events besides. On the 1M-kernel trace (757 MB) the pieces take a median 21% off the wall time of
`python -m analysis.overlap` on two cores (measured against one piece, in turns, under load;
benchmarks/headline.py). A cut inside a string or a nested object makes a piece fail to decode, which
sends the file to the whole decode below, as a wrong split does.

The event array's place is found without a pass over it (`_split_top`): its opening is the first
`"traceEvents": [`, its close the last `]` after an event's `}` whose following text ends the
top-level object, and decoding the file with the events cut out (the rest of the top level: a few
kB) must give `traceEvents: []`. Head and tail checked that way, and every batch decoded, the
whole file has been validated. When the quick split does not check out (or a batch then fails,
which a wrong split would cause), the top level is decoded whole, skipping over the event array,
and the events are decoded from there: that path also gives the errors. The whole decode touches every
page of the mapping at once: on the 1M-kernel trace it took the peak RSS of `python -m analysis.overlap`
from about 300 to 850 MiB and its wall time up by a third (benchmarks/headline.py's kineto_1m, in turns).

Times: columns hold int64 ns on the file's own clock and `clock_offset` is baseTimeNanoseconds (absent
in old traces, whose timestamps are absolute), so files of one job line up like nsys exports do.
"""

from __future__ import annotations

import contextlib
import gzip
import mmap
import multiprocessing
import os
import pickle
import re
import tempfile
import zlib
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from analysis.errors import TraceError
from analysis.trace.readers.kineto_columns import batch_columns, joined
from analysis.trace.readers.kineto_events import CUT, event_batches
from analysis.trace.readers.sniff import GZIP_MAGIC
from analysis.trace.readers.sqlite_chunks import read_workers
from contract import META_KEY

MMAP_BYTES = 1 << 20  # plain JSON files from this size on are mapped, not read
PIECE_BYTES = 64 * 2**20  # no piece smaller than this: below, a process's start costs more than it saves
MAX_PIECES = 4
SPLIT_TRIES = 64  # closing brackets tried, from the end, before the whole top level is decoded instead
_EVENTS_OPEN = re.compile(rb'"traceEvents"\s*:\s*\[')
_BLANK = frozenset(b" \t\r\n")


class RawFile(msgspec.Struct, kw_only=True):
    """The top level of a Kineto file, its events left undecoded (a slice of the text)."""

    traceEvents: msgspec.Raw
    baseTimeNanoseconds: int = 0
    distributedInfo: Any = None
    ddp_meta: Any = msgspec.field(name=META_KEY, default=None)
    deviceProperties: Any = None
    host_name: Any = None


@dataclass
class KinetoFile:
    """One file's content as columns (times int64 ns on the file's clock)."""

    clock_offset: int
    distributed: dict
    meta: dict
    info: dict  # as frames.trace.Trace.info: {"gpus": {device id: {name, uuid}}, "hostname"} where recorded
    gpu: dict  # kind, name (categorical), device, stream, start, end, correlation, comm_bytes
    runtime: dict  # pid, tid, start, correlation
    ranges: dict  # pid, tid, start, end, text (list), async (bool)
    autograd: dict  # pid, tid, start, end: autograd engine ops (the backward pass of anyone's code)
    comms: dict  # pid, tid, start, end, args (list of Args): record_param_comms ops
    host_pids: np.ndarray


def read_kineto(path: Path) -> KinetoFile:
    """Decode `path` into a KinetoFile (TraceError with a one-line reason when it is not one)."""
    data = _read_bytes(path)
    split = _split_top(data)
    batches = None
    if split is not None:
        doc, first, last = split
        with contextlib.suppress(TraceError):  # a wrong split fails so too: the whole decode below names the fault
            batches = _in_pieces(path, data, first + 1, last)
    if batches is None:
        doc = _decode_top(path, data)
        data, first, last = _raw_bounds(path, data, doc.traceEvents)
        doc.traceEvents = msgspec.Raw()  # the raw slice keeps data alive
        batches = _columns(path, data, first + 1, last)
    del data
    columns = joined(batches)
    runtime, ranges, autograd = columns["runtime"], columns["ranges"], columns["autograd"]

    # the process(es) recorded: what launched GPU work, opened ranges or ran ops (a sample of those)
    host = np.concatenate([runtime["pid"], ranges["pid"], autograd["pid"], columns["sampled_pids"]])
    host_pids, counts = np.unique(host[host >= 0], return_counts=True)
    return KinetoFile(
        clock_offset=int(doc.baseTimeNanoseconds or 0),
        distributed=doc.distributedInfo if isinstance(doc.distributedInfo, dict) else {},
        meta=doc.ddp_meta if isinstance(doc.ddp_meta, dict) else {},
        info=_info(doc),
        gpu=columns["gpu"],
        runtime=runtime,
        ranges=ranges,
        autograd=autograd,
        comms=columns["comms"],
        host_pids=host_pids[np.argsort(-counts, kind="stable")],
    )


def _columns(path: Path, data: bytes | mmap.mmap, start: int, last: int) -> list[dict]:
    """The columns of each batch of the event text data[start:last]."""
    return [batch_columns(events) for events in event_batches(path, data, start, last)]


def _in_pieces(path: Path, data: bytes | mmap.mmap, start: int, last: int) -> list[dict]:
    """_columns of the event text data[start:last], its pieces decoded by forked processes (each maps the
    file itself) where the file is mapped and large enough; else all of it here."""
    spans = _pieces(data, start, last) if isinstance(data, mmap.mmap) else [(start, last)]
    if len(spans) == 1 or "fork" not in multiprocessing.get_all_start_methods():
        return _columns(path, data, start, last)
    fork = multiprocessing.get_context("fork")
    try:
        with tempfile.TemporaryDirectory() as folder, ProcessPoolExecutor(len(spans), mp_context=fork) as pool:
            outs = [Path(folder) / f"{i}.pickle" for i in range(len(spans))]
            pieces = [pool.submit(_mapped_columns, path, *span, out) for span, out in zip(spans, outs, strict=True)]
            for piece in pieces:
                piece.result()  # a piece's TraceError, raised here
            return [batch for out in outs for batch in _unpickled(out)]
    except (BrokenProcessPool, OSError):  # a process could not start, or died (memory): all of it here
        return _columns(path, data, start, last)


def _mapped_columns(path: Path, start: int, last: int, out: Path) -> None:
    """_columns of data[start:last] of the file at `path`, mapped here (a piece, in a forked process), pickled
    into the file `out`: read back from a file, array by array, they need no second copy in memory, as a
    whole pickled result sent through a pipe does (about 80 MiB more at 1M kernels)."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        columns = _columns(path, data, start, last)
    with open(out, "wb") as written:
        pickle.dump(columns, written, protocol=pickle.HIGHEST_PROTOCOL)


def _unpickled(path: Path) -> list[dict]:
    with open(path, "rb") as f:
        return pickle.load(f)


def _pieces(data: mmap.mmap, start: int, last: int) -> list[tuple[int, int]]:
    """(start, last) of contiguous pieces of the event text data[start:last], each from an event's `{` to
    an event's `}`, cut where CUT matches after each piece's share of the text."""
    count = max(1, min(read_workers(), MAX_PIECES, (last - start) // PIECE_BYTES))
    spans, begin = [], start
    for i in range(1, count):
        cut = CUT.search(data, max(begin + 1, start + (last - start) * i // count), last)
        if cut is None:
            break
        spans.append((begin, cut.start() + 1))
        begin = cut.end() - 1
    return [*spans, (begin, last)]


def _read_bytes(path: Path) -> bytes | mmap.mmap:
    """The file's JSON text: decompressed when gzipped, memory-mapped (read-only) when plain and large."""
    try:
        with open(path, "rb") as f:
            head = f.read(2)
            if head != GZIP_MAGIC and os.fstat(f.fileno()).st_size >= max(MMAP_BYTES, 1):  # no map of nothing
                return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            data = head + f.read()
        return gzip.decompress(data) if head == GZIP_MAGIC else data
    except (EOFError, gzip.BadGzipFile, zlib.error) as e:
        raise TraceError(f"{path}: truncated or corrupt gzip file ({e})") from None
    except OSError as e:
        raise TraceError(f"{path}: cannot read ({e.strerror or e})") from None


def _decode_top(path: Path, data: bytes | mmap.mmap) -> RawFile:
    """The top-level keys, the events as one raw slice of `data` (validates the whole JSON)."""
    try:
        return msgspec.json.decode(data, type=RawFile)
    except msgspec.ValidationError as e:
        raise TraceError(f"{path}: JSON but not a torch.profiler (Kineto) trace ({e})") from None
    except msgspec.DecodeError as e:
        raise TraceError(f"{path}: not valid JSON ({e})") from None


def _split_top(data: bytes | mmap.mmap) -> tuple[RawFile, int, int] | None:
    """(top-level keys, place of the event array's `[`, of its `]`) without a pass over the events,
    or None when no split checks out on the top level (see the module docstring). The events'
    decode confirms it: the list of an array-valued key after the events can pass for their end."""
    opening = _EVENTS_OPEN.search(data)
    if opening is None:
        return None
    first = opening.end() - 1
    close = len(data)
    whole = memoryview(data)
    try:
        for _ in range(SPLIT_TRIES):
            close = data.rfind(b"]", first + 1, close)
            if close < 0:
                return None
            before = close - 1
            while data[before] in _BLANK:
                before -= 1
            if before != first and data[before] != ord("}"):
                continue  # an array closes after its last event's "}" (or at once when empty)
            try:
                doc = msgspec.json.decode(b"".join((whole[: first + 1], whole[close:])), type=RawFile)
            except msgspec.MsgspecError:
                continue
            if bytes(doc.traceEvents) == b"[]":
                return doc, first, close
        return None
    finally:
        whole.release()


def _raw_bounds(path: Path, data: bytes | mmap.mmap, events: msgspec.Raw) -> tuple[bytes | mmap.mmap, int, int]:
    """(data, place of `[`, of `]`) of the raw event array `events`, a slice of data (or a copy)."""
    view = np.frombuffer(events, dtype=np.uint8)
    first = view.ctypes.data - np.frombuffer(data, dtype=np.uint8).ctypes.data  # the slice's place in data
    if not 0 <= first <= len(data) - view.size:  # a copy, not a view: use it as it is
        data, first = bytes(events), 0
    last = first + view.size - 1
    if data[first : first + 1] != b"[" or data[last : last + 1] != b"]":
        raise TraceError(f"{path}: JSON but not a torch.profiler (Kineto) trace (traceEvents is not an array)")
    return data, first, last


def _info(doc: RawFile) -> dict:
    """The machine as the trace describes it: GPUs from deviceProperties, the host name."""
    gpus = [d for d in doc.deviceProperties or [] if isinstance(d, dict) and isinstance(d.get("id"), int)]
    info: dict = {}
    if gpus:
        info["gpus"] = {d["id"]: {"name": str(d.get("name", "")), "uuid": d.get("uuid")} for d in gpus}
    if doc.host_name:
        info["hostname"] = str(doc.host_name)
    return info
