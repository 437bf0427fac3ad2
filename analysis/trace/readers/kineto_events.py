"""The typed structs a Kineto trace's events decode into (msgspec), and the decoders of an event batch.

Only what the analysis reads is kept: a complete event (`ph: "X"`) keeps its category, name, pid, tid,
times and the `args` keys listed in `Args`; every other phase decodes to an empty struct (`SKIPPED`),
and unknown keys are skipped without building Python objects. `FAST` decodes times as float µs
(`FAST_INT_IDS` too, for files whose pids and tids are all integers, the usual case),
`EXACT` as decimals (for timestamps too large for float64 ns), `LENIENT` any phase as a plain field.
kineto_json.py cuts the file into batches and applies these; kineto_columns.py turns the structs into columns.
"""

from __future__ import annotations

import functools
import operator
from decimal import Decimal
from typing import Any

import msgspec

from contract import ASYNC_KIND_KEY, PAYLOAD_KEY


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


class IntIdsComplete(Fields, gc=False, tag="X", tag_field="ph"):
    """A complete event whose pid and tid are integers, as torch.profiler writes them: a tenth less decode time
    than the int | str fields (a batch with a named pid or tid fails it, and is decoded with Complete)."""

    pid: int = -1
    tid: int = -1


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


# Complete | Skip_66 | ...: built at run time from the phases, so typed Any (no static type names it)
FAST_EVENT: Any = functools.reduce(operator.or_, SKIPPED, Complete)
FAST = msgspec.json.Decoder(list[FAST_EVENT])
FAST_INT_IDS = msgspec.json.Decoder(list[functools.reduce(operator.or_, SKIPPED, IntIdsComplete)])  # type: ignore[misc]
EXACT = msgspec.json.Decoder(list[functools.reduce(operator.or_, SKIPPED, ExactComplete)])  # type: ignore[misc]
LENIENT = msgspec.json.Decoder(list[AnyPhase])
