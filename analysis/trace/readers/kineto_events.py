"""A Kineto trace's event array decoded batch by batch into small typed structs: `event_batches`.

JSON parsing is the whole cost of reading these files, so msgspec decodes straight into structs that
keep only what the analysis reads: a complete event (`ph: "X"`) keeps its category, name, pid, tid,
times and the `args` keys listed in `Args`; every other phase (flows, metadata, instants, counters)
decodes to an empty struct (`SKIPPED`), and unknown keys are skipped without building Python objects.

To bound memory, the events are decoded in batches of about 16 MB of text, each turned into columns
and dropped before the next. A batch is cut after the `}` of an event followed by `,` and `{`; a cut
that falls inside a string or a nested object leaves the batch unbalanced, so its decode fails, and
the batch is extended to the next cut. A memory-mapped file's pages are unmapped from the process once
their batch is decoded (`_release`): without it, the 1M-kernel trace's read peaked at about 455 MiB
instead of 300 (benchmarks/headline.py's kineto_1m, in turns).

Decoders: `FAST` takes times as float µs; `EXACT` takes them as decimals, for a batch whose timestamps
are too large for float64 ns (absolute epoch µs); `LENIENT` takes any phase as a plain field, for a
batch that fits neither and for its error message.
"""

from __future__ import annotations

import functools
import mmap
import operator
import re
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from analysis.errors import TraceError
from contract import ASYNC_KIND_KEY, PAYLOAD_KEY

EXACT_FLOAT_US = 2.0**43  # below this a float64 µs value is within 0.49 ns of its decimal text: ns are exact


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
    pg_ranks: Any = msgspec.field(name="Process Group Ranks", default=None)
    payload: Any = msgspec.field(name=PAYLOAD_KEY, default=-1)  # our recorder's range payload (a comm call's bytes)


class Fields(msgspec.Struct, gc=False):
    cat: str = ""
    name: str = ""
    pid: int | str = -1
    tid: int | str = -1
    ts: float = 0.0
    dur: float = 0.0
    args: Args = msgspec.field(default_factory=Args)


class Complete(Fields, gc=False, tag="X", tag_field="ph"):
    """A complete event ("ph": "X"): everything this analysis reads is one."""


class ExactComplete(Fields, gc=False, tag="X", tag_field="ph"):
    """A complete event with its times as written (decimals): for timestamps too large for float64 ns."""

    ts: Decimal = Decimal(0)  # type: ignore[assignment]
    dur: Decimal = Decimal(0)  # type: ignore[assignment]


class AnyPhase(Fields, gc=False):
    """The lenient form: any phase, as a plain field."""

    ph: str = ""


# Every other phase of the Chrome trace event format: nothing of them is kept. Their class attributes (no
# field, no per-event cost) answer `cat` and `ts` as an event of no category at 0 does, so a batch's columns
# are read from the decoded list as it is, with no pass to drop these first.
SKIPPED = tuple(
    msgspec.defstruct(f"Skip_{ord(c)}", [], tag=c, tag_field="ph", gc=False, namespace={"cat": "", "ts": 0.0})
    for c in "BEiICbnestfPONDMRcpvV()"
)


def _decoder(complete: type) -> msgspec.json.Decoder:
    """A decoder of a list of events: `complete` for "X", an empty struct for every other phase."""
    event: Any = functools.reduce(operator.or_, SKIPPED, complete)  # built at run time: no static type names it
    return msgspec.json.Decoder(list[event])


FAST = _decoder(Complete)
EXACT = _decoder(ExactComplete)
LENIENT = msgspec.json.Decoder(list[AnyPhase])

BATCH_BYTES = 16 * 2**20  # event text decoded at a time
CUT = re.compile(rb"\}\s*,\s*\{")


def event_batches(path: Path, data: bytes | mmap.mmap, start: int, last: int) -> Iterator[list]:
    """The complete events of the event text data[start:last] (inside the array's brackets), batch by batch."""
    whole = memoryview(data)
    try:
        while True:
            cut = CUT.search(data, min(start + BATCH_BYTES, last), last)
            while True:
                end = cut.start() + 1 if cut else last
                try:
                    complete = _complete_events(path, b"".join((b"[", whole[start:end], b"]")))
                    break
                except msgspec.DecodeError:  # the cut fell inside a string or a nested object
                    if cut is None:
                        raise TraceError(f"{path}: not valid JSON (in traceEvents)") from None
                    cut = CUT.search(data, cut.end(), last)
            _release(data, start, end)
            yield complete
            del complete  # before the next batch is decoded: one batch of events alive at a time
            if cut is None:
                return
            start = cut.end() - 1  # the "{" of the next event
    finally:
        whole.release()


def _release(data: bytes | mmap.mmap, start: int, stop: int) -> None:
    """Unmap the whole pages of a mapped file's data[start:stop], decoded and not read again, from this
    process (the page cache keeps them): its memory holds a batch of the file, not all it has read."""
    page = mmap.PAGESIZE
    low, high = -(-start // page) * page, stop // page * page
    if isinstance(data, mmap.mmap) and high > low and hasattr(data, "madvise"):
        data.madvise(mmap.MADV_DONTNEED, low, high - low)


def _complete_events(path: Path, batch: bytes) -> list:
    """A batch of events, decoded: its complete events, and maybe skipped ones (category "")."""
    try:
        events = FAST.decode(batch)
        return EXACT.decode(batch) if _beyond_float_ns(events) else events
    except msgspec.ValidationError:
        pass  # events that do not fit the fast types: try the lenient ones, for a precise message
    try:
        events = LENIENT.decode(batch)
    except msgspec.ValidationError as e:
        raise TraceError(f"{path}: JSON but not a torch.profiler (Kineto) trace (an event: {e})") from None
    return [e for e in events if e.ph == "X"]


def _beyond_float_ns(events: list) -> bool:
    """True when a timestamp is too large for float64 to keep its ns (|ts| >= EXACT_FLOAT_US): decode exactly."""
    ts = np.fromiter(map(operator.attrgetter("ts"), events), dtype=np.float64, count=len(events))
    return bool(ts.size) and float(np.abs(ts).max()) >= EXACT_FLOAT_US
