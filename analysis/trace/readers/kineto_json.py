"""Parse one Kineto trace (torch.profiler Chrome-trace JSON, `.json` or `.json.gz`) into columns.

JSON parsing is the whole cost of reading these files, so msgspec decodes straight into small typed
structs (kineto_events.py): complete (`ph: "X"`) events keep only the fields the analysis reads, every other phase
(flows, metadata, instants, counters) decodes to an empty struct, and unknown keys are skipped
without building Python objects. To bound memory, the event list is decoded in batches of about
16 MB of text, each turned into numpy columns and dropped before the next; the batches are cut
after the `}` of an event followed by `,` and `{`. A cut that falls inside a string or a nested
object leaves that batch unbalanced, so its decode fails, and the batch is extended to the next
cut. The fast types take pids and tids as integers until a batch names one (`_FastDecoder`); a
batch whose events do not fit them (an unusual phase, say) is decoded again leniently. Uncompressed
files are memory-mapped (privately: a batch is decoded between brackets written into the mapping
around it, not copied, `_decoded`), and a batch's pages are unmapped from the process once decoded
(`_release`). A large file's event text is first cut into pieces decoded on several cores
(kineto_parts.py), which a CLI starts before it imports the analysis (`start_read`).

The event array's place is found without a pass over it (`_split_top`): its opening is the first
`"traceEvents": [`, its close the last `]` after an event's `}` whose following text ends the
top-level object, and decoding the file with the events cut out (the rest of the top level: a few
kB) must give `traceEvents: []`. Head and tail checked that way, and every batch decoded, the
whole file has been validated. When the quick split does not check out (or a batch then fails,
which a wrong split would cause), the top level is decoded whole, skipping over the event array
(about 0.5 s per GB), and the events are decoded from there: that path also gives the errors.

Times: Kineto writes microseconds (float, 3 decimals) after `baseTimeNanoseconds` (absent in old
traces, whose timestamps are absolute); columns hold int64 ns on the file's own clock and
`clock_offset` is baseTimeNanoseconds, so files of one job line up like nsys exports do. Times are
exact to the ns as written: below 2**43 µs (101 days) a float64 lies within 0.49 ns of its decimal
text, and integral and fractional µs are scaled to ns apart (kineto_columns._ns); a batch with a
larger timestamp (absolute epoch µs, ~1.7e15, where float64 keeps only 1/4 µs) is decoded again with
its times as decimals (`ExactComplete`).
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import mmap
import operator
import os
import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from analysis.errors import TraceError
from analysis.trace.readers.kineto_columns import EXACT_FLOAT_US, batch_columns, field_values, joined, take
from analysis.trace.readers.kineto_events import EXACT, FAST, FAST_INT_IDS, LENIENT
from analysis.trace.readers.kineto_parts import Workers, cut_worth, decode_in_parts, pieces
from analysis.trace.readers.sniff import GZIP_MAGIC
from contract import META_KEY


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


@dataclass
class KinetoFile:
    """One file's content as columns (times int64 ns on the file's clock)."""

    path: Path
    clock_offset: int
    schema: str
    distributed: dict
    meta: dict
    info: dict  # as frames.trace.Trace.info: {"gpus": {device id: {name, uuid}}, "hostname"} where recorded
    gpu: dict  # kind, name (kineto_columns.Coded), device, stream, start, end, correlation, comm_bytes
    runtime: dict  # pid, tid, start, correlation
    ranges: dict  # pid, tid, start, end, text (list), async (bool)
    autograd: dict  # pid, tid, start, end: autograd engine ops (the backward pass of anyone's code)
    comms: list  # (pid, tid, start, end, Args) of record_param_comms ops
    host_pids: np.ndarray


MMAP_BYTES = 1 << 20  # plain JSON files from this size on are mapped, not read


def _read_bytes(path: Path) -> bytes | mmap.mmap:
    """The file's JSON text: decompressed when gzipped, memory-mapped when plain and large (a private,
    writable mapping: a batch's brackets are written around it in place, `_decoded`; the file never is)."""
    try:
        with open(path, "rb") as f:
            head = f.read(2)
            if head != GZIP_MAGIC and os.fstat(f.fileno()).st_size >= max(MMAP_BYTES, 1):  # no map of nothing
                return _map(f.fileno())
            data = head + f.read()
        return gzip.decompress(data) if head == GZIP_MAGIC else data
    except (EOFError, gzip.BadGzipFile, zlib.error) as e:
        raise TraceError(f"{path}: truncated or corrupt gzip file ({e})") from None
    except OSError as e:
        raise TraceError(f"{path}: cannot read ({e.strerror or e})") from None


def _map(fd: int) -> mmap.mmap:
    try:
        return mmap.mmap(fd, 0, access=mmap.ACCESS_COPY)
    except OSError:  # a writable mapping refused (strict overcommit): read-only, batches copied to decode
        return mmap.mmap(fd, 0, access=mmap.ACCESS_READ)


def _decode_top(path: Path, data: bytes | mmap.mmap) -> RawFile:
    """The top-level keys, the events as one raw slice of `data` (validates the whole JSON)."""
    try:
        return msgspec.json.decode(data, type=RawFile)
    except msgspec.ValidationError as e:
        raise TraceError(f"{path}: JSON but not a torch.profiler (Kineto) trace ({e})") from None
    except msgspec.DecodeError as e:
        raise TraceError(f"{path}: not valid JSON ({e})") from None


_EVENTS_OPEN = re.compile(rb'"traceEvents"\s*:\s*\[')
_BLANK = frozenset(b" \t\r\n")
SPLIT_TRIES = 64  # closing brackets tried, from the end, before the whole top level is decoded instead


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


def _event_batches(path: Path, data: bytes | mmap.mmap, start: int, last: int) -> Iterator[list]:
    """The complete events of the event text data[start:last] (inside the array's brackets), batch by batch."""
    whole = memoryview(data)
    fast = _FastDecoder()
    try:
        while True:
            cut = _CUT.search(data, min(start + BATCH_BYTES, last), last)
            while True:
                end = cut.start() + 1 if cut else last
                try:
                    complete = _decoded(path, data, whole, start, end, fast)
                    break
                except msgspec.DecodeError:  # the cut fell inside a string or a nested object
                    if cut is None:
                        raise TraceError(f"{path}: not valid JSON (in traceEvents)") from None
                    cut = _CUT.search(data, cut.end(), last)
            _release(data, start, end)
            yield complete
            del complete  # before the next batch is decoded: one batch of events alive at a time
            if cut is None:
                return
            start = cut.end() - 1  # the "{" of the next event
    finally:
        whole.release()


def _decoded(path: Path, data: bytes | mmap.mmap, whole: memoryview, start: int, end: int, fast: _FastDecoder) -> list:
    """The complete events of the events data[start:end] decoded as a JSON array. In a writable mapping the
    bytes just outside them (the array's own bracket, or the blanks and comma between two events) become
    `[` and `]` while it decodes, so the text is not copied; elsewhere it is, with brackets."""
    if whole.readonly or not isinstance(data, mmap.mmap):
        return _complete_events(path, b"".join((b"[", whole[start:end], b"]")), fast)
    before, after = data[start - 1], data[end]
    data[start - 1], data[end] = ord("["), ord("]")
    try:
        return _complete_events(path, whole[start - 1 : end + 1], fast)
    finally:
        data[start - 1], data[end] = before, after


def _release(data: bytes | mmap.mmap, start: int, stop: int) -> None:
    """Unmap the whole pages of a mapped file's data[start:stop], decoded and not read again, from this
    process (the page cache keeps them): its memory holds a batch of the file, not all it has read."""
    page = mmap.PAGESIZE
    low, high = -(-start // page) * page, stop // page * page
    if isinstance(data, mmap.mmap) and high > low and hasattr(data, "madvise"):
        data.madvise(mmap.MADV_DONTNEED, low, high - low)


class _FastDecoder:
    """The fast decode of one pass over the events: FAST_INT_IDS until a batch does not fit it (a pid or tid
    that is not an integer, as Chrome's named pids), FAST from then on, so that no more than one batch a
    pass is decoded twice."""

    def __init__(self) -> None:
        self.int_ids = True

    def decode(self, batch: bytes | memoryview) -> list:
        if self.int_ids:
            try:
                return FAST_INT_IDS.decode(batch)
            except msgspec.ValidationError:
                self.int_ids = False
        return FAST.decode(batch)


def _complete_events(path: Path, batch: bytes | memoryview, fast: _FastDecoder) -> list:
    """A batch of events, decoded: its complete events, and maybe skipped ones (category "", kineto_events.py)."""
    try:
        events = fast.decode(batch)
        return EXACT.decode(batch) if _beyond_float_ns(events) else events
    except msgspec.ValidationError:
        pass  # events that do not fit the fast types: try the lenient ones, for a precise message
    try:
        events = LENIENT.decode(batch)
    except msgspec.ValidationError as e:
        raise TraceError(f"{path}: JSON but not a torch.profiler (Kineto) trace (an event: {e})") from None
    return take(events, np.flatnonzero(np.array(field_values(events, "ph"), dtype=object) == "X"))


def _beyond_float_ns(events: list) -> bool:
    """True when a timestamp is too large for float64 to keep its ns (|ts| >= EXACT_FLOAT_US): decode exactly."""
    ts = np.fromiter(map(operator.attrgetter("ts"), events), dtype=np.float64, count=len(events))
    return bool(ts.size) and float(np.abs(ts).max()) >= EXACT_FLOAT_US


ARENA_KEEP = 256  # one decoded event in this many is kept until the text is read (`_columns`)


def _columns(path: Path, data: bytes | mmap.mmap, start: int, last: int) -> list[dict]:
    """The columns of each batch of the event text data[start:last]. A few of each batch's events are kept
    to the end: Python's small-object allocator hands an arena (1 MiB) back to the system once nothing in
    it lives, so without them every batch's 10-15 MB of events would be mapped afresh (page faults, a
    tenth of the decode's time); with them the next batch reuses the arenas, and memory stays a batch's."""
    out, kept = [], []
    for events in _event_batches(path, data, start, last):
        out.append(batch_columns(events))
        kept.append(events[::ARENA_KEEP])
        del events
    return out


def _info(doc: RawFile) -> dict:
    """The machine as the trace describes it: GPUs from deviceProperties, the host name."""
    gpus = [d for d in doc.deviceProperties or [] if isinstance(d, dict) and isinstance(d.get("id"), int)]
    info: dict = {}
    if gpus:
        info["gpus"] = {d["id"]: {"name": str(d.get("name", "")), "uuid": d.get("uuid")} for d in gpus}
    if doc.host_name:
        info["hostname"] = str(doc.host_name)
    return info


Split = tuple[RawFile, int, int]  # the top-level keys, the places of the event array's `[` and `]`


@dataclass
class _Started:
    """A file `start_read` mapped and split, and the workers decoding its pieces (None: too few to cut)."""

    data: mmap.mmap
    split: Split | None
    workers: Workers | None


_STARTED: dict[Path, _Started] = {}


def start_read(path: Path, head: bytes) -> None:
    """Start decoding a large file's events in forked workers, one per piece (a CLI calls this before it
    imports the analysis: trace/readers/read_ahead.py, with the file's first bytes); read_kineto(path)
    takes their columns. A gzipped file (decompressed when read), a small one or one that cannot be
    opened is left to read_kineto."""
    try:
        if head[:2] == GZIP_MAGIC or not cut_worth(path.stat().st_size):
            return
        with open(path, "rb") as f:
            data = _map(f.fileno())
    except OSError:
        return
    split = _split_top(data)
    spans = pieces(data, split[1] + 1, split[2], _CUT) if split else []
    workers = Workers(functools.partial(_columns, path, data), spans) if len(spans) > 1 else None
    _STARTED[path] = _Started(data, split, workers)


def discard_started() -> None:
    """Stop the workers `start_read` started for files never read (the command failed first)."""
    while _STARTED:
        workers = _STARTED.popitem()[1].workers
        if workers is not None:
            workers.close()


def _opened(path: Path) -> tuple[bytes | mmap.mmap, Split | None, list | None]:
    """(text, split, batches) of `path`: as `start_read` left it (batches from its workers, None when it
    started none), else read now (batches None). The split is None when it did not check out, or when a
    started piece failed to decode (which a wrong split causes): the caller then decodes the whole file."""
    started = _STARTED.pop(path, None)
    if started is None:
        data = _read_bytes(path)
        return data, _split_top(data), None
    if started.workers is None:
        return started.data, started.split, None
    try:
        return started.data, started.split, started.workers.results()
    except TraceError:
        return started.data, None, None
    finally:
        started.workers.close()


def read_kineto(path: Path) -> KinetoFile:
    """Decode `path` into a KinetoFile (TraceError with a one-line reason when it is not one)."""
    data, split, batches = _opened(path)
    if split is not None and batches is None:
        doc, first, last = split
        decode = functools.partial(_columns, path, data)
        with contextlib.suppress(TraceError):  # a wrong split fails so too: the whole decode below names the fault
            batches = decode_in_parts(decode, pieces(data, first + 1, last, _CUT))
    elif split is not None:
        doc = split[0]
    if batches is None:
        doc = _decode_top(path, data)
        data, first, last = _raw_bounds(path, data, doc.traceEvents)
        doc.traceEvents = msgspec.Raw()  # the raw slice keeps data alive
        batches = _columns(path, data, first + 1, last)
    del data
    columns = joined(batches)
    gpu, runtime, ranges, autograd, comms = (columns[f] for f in ("gpu", "runtime", "ranges", "autograd", "comms"))
    sampled = columns["sampled_pids"]

    # the process(es) recorded: what launched GPU work, opened ranges or ran ops (a sample of those)
    host = np.concatenate([runtime["pid"], ranges["pid"], autograd["pid"], sampled])
    host_pids, counts = np.unique(host[host >= 0], return_counts=True)
    return KinetoFile(
        path=path,
        clock_offset=int(doc.baseTimeNanoseconds or 0),
        schema=str(doc.schemaVersion) if doc.schemaVersion is not None else "unknown",
        distributed=doc.distributedInfo if isinstance(doc.distributedInfo, dict) else {},
        meta=doc.ddp_meta if isinstance(doc.ddp_meta, dict) else {},
        info=_info(doc),
        gpu=gpu,
        runtime=runtime,
        ranges=ranges,
        autograd=autograd,
        comms=comms,
        host_pids=host_pids[np.argsort(-counts, kind="stable")],
    )
