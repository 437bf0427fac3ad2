"""The measured region under torch.profiler: one Kineto trace per rank, no nsys needed.

`measured_region(meta, path)` is profiling.capture's region with torch.profiler in place of nsys:
after a barrier (warm-up done) it starts the profiler (CPU activities, plus CUDA when a GPU is in
use) and routes ddp's NVTX ranges to record_function ranges of the same names (`profile`,
`step N`, `forward`, `backward`, `grad_sync`, `optimizer`, `comm:*`); at the end it stops the
profiler and writes `path` (gzipped Chrome-trace JSON) under a temporary name first.

record_function ranges must end on the thread that opened them, but ddp's async `comm:` ranges
start in a backward hook and end in a collective's completion callback. Those start/end ranges are
timed here (wall clock, the clock Kineto's timestamps count from `baseTimeNanoseconds`) and
added to the trace after export as `user_annotation` events with `args["ddp.kind"] = "start_end"`,
which analysis.trace.readers.kineto reads as start/end ranges. A range's integer payload (a `comm:` range's
byte count, which nsys stores in NVTX_EVENTS.int64Value) goes into its event's `args["ddp.payload"]`:
for start/end ranges with the event, for push/pop ones (record_function takes no payload) added after
export to the k-th `user_annotation` event of that name, in time order, when the counts agree. The
run's metadata goes to the top-level key `ddp.meta` (nsys traces carry it in a `ddp.meta` mark).
"""

from __future__ import annotations

import contextlib
import gzip
import os
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile, record_function

from contract import ASYNC_KIND, ASYNC_KIND_KEY, META_KEY, PAYLOAD_KEY, PROFILE
from ddp.comm import nvtx_ranges
from profiling.capture import run_meta

if TYPE_CHECKING:
    from ddp.strategies.base import DataParallelBase

_TOKEN = "torch-range"


class TorchRanges:
    """nvtx_ranges' recorder under torch.profiler (see the module docstring)."""

    def __init__(self) -> None:
        # name, thread, start ns, end ns, payload (None: none) of each start/end range (list.append is atomic)
        self.spans: list[tuple[str, int, int, int, int | None]] = []
        self.payloads: list[tuple[str, int, int]] = []  # name, start ns, payload of each push/pop range with one

    def range(self, name: str, payload: int | None = None) -> contextlib.AbstractContextManager:
        if payload is not None:
            self.payloads.append((name, time.time_ns(), payload))
        return record_function(name)

    def start(self, name: str, payload: int | None = None) -> tuple:
        return (_TOKEN, name, threading.get_native_id(), time.time_ns(), payload)

    def end(self, token: object) -> None:
        if isinstance(token, tuple) and token[:1] == (_TOKEN,):  # ids of NVTX ranges opened before: ignored
            _, name, tid, started, payload = token
            self.spans.append((name, tid, started, time.time_ns(), payload))

    def mark(self, text: str) -> None:
        """Marks carry the run's metadata, which goes to the trace's top level instead."""


def _barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def activities() -> list[ProfilerActivity]:
    """CPU always; CUDA when this process uses a GPU."""
    return [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])


def _span_events(spans: list, base_ns: int, since_ns: int) -> list[dict]:
    pid = os.getpid()
    return [
        {
            "ph": "X",
            "cat": "user_annotation",
            "name": name,
            "pid": pid,
            "tid": tid,
            "ts": round((start - base_ns) / 1000, 3),
            "dur": round((end - start) / 1000, 3),
            "args": {ASYNC_KIND_KEY: ASYNC_KIND, **({PAYLOAD_KEY: payload} if payload is not None else {})},
        }
        for name, tid, start, end, payload in spans
        if start >= since_ns
    ]


def add_payloads(events: list[dict], payloads: list[tuple[str, int, int]], since_ns: int, until_ns: int) -> int:
    """Put each push/pop range's payload (name, start ns, payload; those opened in [since, until)) into
    args[PAYLOAD_KEY] of the exported `user_annotation` events of that name: the k-th opened to the k-th
    in time order, for each name whose counts agree (a name that does not keeps no payload). Returns
    how many events got one."""
    by_name: dict[str, list[tuple[int, int]]] = {}
    for name, started, payload in payloads:  # one per comm call: thousands, not millions
        if since_ns <= started < until_ns:
            by_name.setdefault(name, []).append((started, payload))
    named: dict[str, list[dict]] = {}
    for event in events:
        if event.get("cat") == "user_annotation" and event.get("name") in by_name and event.get("ph") == "X":
            named.setdefault(event["name"], []).append(event)
    done = 0
    for name, mine in named.items():
        recorded = sorted(by_name[name])
        if len(recorded) != len(mine):
            continue
        for event, (_, payload) in zip(sorted(mine, key=lambda e: float(e.get("ts", 0))), recorded, strict=True):
            event["args"] = {**(event.get("args") or {}), PAYLOAD_KEY: payload}
            done += 1
    return done


def write_trace(
    prof: profile, path: Path, ranges: TorchRanges, since_ns: int, meta: Mapping[str, Any], until_ns: int | None = None
) -> None:
    """Export, add the push/pop ranges' payloads, the start/end ranges and metadata, gzip to `path`
    (temporary name, then rename); `until_ns`: when the profiler stopped (now when not given)."""
    until_ns = time.time_ns() if until_ns is None else until_ns
    raw = path.with_name(f".{path.name}.partial.json")
    packed = path.with_name(f".{path.name}.partial")
    try:
        prof.export_chrome_trace(str(raw))
        doc = msgspec.json.decode(raw.read_bytes())
        add_payloads(doc["traceEvents"], ranges.payloads, since_ns, until_ns)
        doc["traceEvents"] += _span_events(ranges.spans, int(doc.get("baseTimeNanoseconds", 0)), since_ns)
        doc[META_KEY] = dict(meta)
        packed.write_bytes(gzip.compress(msgspec.json.encode(doc, enc_hook=str), compresslevel=6))
        os.replace(packed, path)
    finally:
        raw.unlink(missing_ok=True)
        packed.unlink(missing_ok=True)


@contextlib.contextmanager
def measured_region(
    meta: Mapping[str, Any],
    path: Path,
    model: DataParallelBase | None = None,
    memory: Mapping[str, Any] | None = None,
) -> Iterator[None]:
    """Wrap the measured steps: barrier, start torch.profiler, ..., barrier, stop, write `path` (its
    `ddp.meta` with `model`'s bucket layout and `memory`, if given, as profiling.capture records them).

    The recorder stays installed afterwards: an async range still open at the end (none is, after
    the closing barrier) must not reach NVTX with a foreign id."""
    _barrier()
    ranges = TorchRanges()
    prof = profile(activities=activities())
    started, since = time.perf_counter(), time.time_ns()
    prof.start()
    nvtx_ranges.record_with(ranges)
    try:
        with nvtx_ranges.range(PROFILE):
            yield
            _barrier()
    finally:
        prof.stop()  # on failure too: the profiler's threads must not outlive the rank
        until = time.time_ns()
    path.parent.mkdir(parents=True, exist_ok=True)
    write_trace(prof, path, ranges, since, run_meta(meta, model, memory), until)  # the layout after the steps
    took = time.perf_counter() - started
    print(
        f"[profiling.torch_profile] wrote {path} ({took:.1f} s: the measured steps, then the trace written)", flush=True
    )
