"""Per-step communication timing that leaves the measured program as it is: host clocks on CPU,
CUDA events on GPU, never a host synchronisation per collective.

A collective is *in flight* from its issue to its completion; `backward_ended()` marks where the
gradients were all computed. Per step, `in_flight_s` is the length of the union of the in-flight
intervals, `hidden_s` the part of it before backward ended, and `comm_time_s = in_flight_s -
hidden_s` the communication the step had to wait for after backward (its exposed part).

- CPU (clock "host"): `time.perf_counter()`. Issue is the host call; completion is a blocking
  call's return, or for an async one the completion callback of its future (gloo completes it on
  its own thread when the data is reduced) or the return of `wait()`, whichever comes first.
  Backward ends when the host learns it (compute on CPU is synchronous).
- CUDA (clock "cuda_events"): a start event on the issuing stream just before the collective
  (it fires when that stream reaches the issue point, i.e. once the gradient exists); a blocking
  collective's end event follows on the same stream, which NCCL makes wait for the collective; an
  async collective's end event goes on a private timing stream made to wait for the collective
  (at its wait point, or for DDP in its future's callback), so it fires at completion without
  making the compute stream or the host wait. Backward's end is an event on the compute stream.
  `collect()` reads every event of the step after one `Event.synchronize()` on a marker recorded
  behind all of them: the caller's end-of-step device synchronisation makes that one free.

On CUDA an async collective's NVTX range cannot end at completion without a host wait, so it ends
in `collect()`, where the host first observes completion: it spans issue to (at the latest) the
end of the step. On CPU it ends at completion.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ddp.comm import nvtx_ranges

# Steps whose records are kept without a `collect()`; then they are folded (one event wait).
MAX_UNCOLLECTED_STEPS = 8


# When a step's backward ended: host seconds (CPU), a recorded CUDA event, or None (not yet known).
BackwardEnd = float | torch.cuda.Event | None


@dataclass
class CommStats:
    """Communication of the steps collected since the last reset (sums over those steps)."""

    num_ops: int = 0
    bytes: int = 0
    in_flight_s: float = 0.0  # per step: length of the union of issue->completion intervals
    hidden_s: float = 0.0  # the part of in_flight_s before backward ended
    clock: str = "host"  # "host" (CPU timers) or "cuda_events"

    @property
    def comm_time_s(self) -> float:
        """Communication after backward ended: what the step waited for (exposed)."""
        return max(0.0, self.in_flight_s - self.hidden_s)

    @property
    def overlap(self) -> float | None:
        """Fraction of in-flight communication that ran during backward (None without any)."""
        return self.hidden_s / self.in_flight_s if self.in_flight_s > 0 else None


def union_and_part_before(intervals: list[tuple[float, float]], cut: float) -> tuple[float, float]:
    """(length of the union of [start, end] intervals, length of that union before `cut`)."""
    if not intervals:
        return 0.0, 0.0
    first, *rest = sorted(intervals)
    total = before = 0.0
    cur_start, cur_end = first
    for start, end in rest:
        if start <= cur_end:
            cur_end = max(cur_end, end)
            continue
        total += cur_end - cur_start
        before += max(0.0, min(cur_end, cut) - cur_start)
        cur_start, cur_end = start, end
    total += cur_end - cur_start
    before += max(0.0, min(cur_end, cut) - cur_start)
    return total, before


class CommTimer:
    """Records the collectives of each step (slots reused step after step) and folds them into stats."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.device = device
        self.stats = CommStats(clock=self._clock)
        self._starts: list = []  # per slot: host seconds (CPU) or a timing Event (CUDA)
        self._ends: list = []
        self._bytes: list[int] = []
        self._used = 0  # slots used since the last fold
        self._backward_end: BackwardEnd = None  # this step's, once known
        self._closed: list[tuple[int, BackwardEnd]] = []  # per closed step: (end slot, backward end)
        self._open_ranges: list = []  # CUDA: async NVTX ranges, ended at collect
        self._generation = 0  # CPU: a late callback of a folded step must not touch reused slots
        if self.cuda:
            self._stream = torch.cuda.Stream(device)
            self._marker = torch.cuda.Event()
            self._backward_events: list = []

    @property
    def _clock(self) -> str:
        return "cuda_events" if self.cuda else "host"

    # ---- recording ------------------------------------------------------------------------
    def begin(self, nbytes: int) -> int:
        """A collective of `nbytes` is about to be issued on the current stream: its slot."""
        slot = self._used
        if slot == len(self._starts):
            new = (lambda: torch.cuda.Event(enable_timing=True)) if self.cuda else (lambda: 0.0)
            self._starts.append(new())
            self._ends.append(new() if self.cuda else float("inf"))
            self._bytes.append(0)
        self._used += 1
        self._bytes[slot] = nbytes
        if self.cuda:
            self._starts[slot].record()
        else:
            self._starts[slot] = time.perf_counter()
        return slot

    def end_blocking(self, slot: int) -> None:
        """A blocking collective returned (on CUDA its work is ordered on the current stream)."""
        if self.cuda:
            self._ends[slot].record()
        else:
            self._ends[slot] = time.perf_counter()

    def track_async(self, slot: int, work: Any, *range_ids: object) -> None:
        """An async collective was issued: end its interval and NVTX ranges at completion."""
        if self.cuda or not hasattr(work, "get_future"):
            self._open_ranges.extend(range_ids)  # CUDA futures complete at enqueue: end at collect
        else:
            work.get_future().then(self.on_completion(slot, *range_ids))

    def on_completion(self, slot: int, *range_ids: object) -> Callable[[object], None]:
        """A callback for the collective's future that records its completion and ends its ranges.

        CPU: the callback runs on the communication thread when the data is reduced. CUDA: it runs
        once the work is queued, on a stream made to wait for it, so it records the end event
        there (through the timing stream) and leaves the ranges to `collect()`.
        """
        if self.cuda:
            self._open_ranges.extend(range_ids)

            def on_cuda(_fut: object) -> None:
                self._stream.wait_stream(torch.cuda.current_stream(self.device))
                self._ends[slot].record(self._stream)

            return on_cuda
        generation = self._generation

        def on_host(_fut: object) -> None:
            for range_id in range_ids:
                nvtx_ranges.end(range_id)
            if generation == self._generation:  # not a late callback of an already folded step
                self._ends[slot] = min(self._ends[slot], time.perf_counter())

        return on_host

    def wait(self, slot: int, work: Any) -> None:
        """Wait for an async collective: the host on CPU; on CUDA only the streams (timing, current)."""
        if self.cuda:
            with torch.cuda.stream(self._stream):
                work.wait()
                self._ends[slot].record()
            work.wait()  # the caller's stream, before it uses the result
        else:
            work.wait()
            self._ends[slot] = min(self._ends[slot], time.perf_counter())

    def backward_ended(self) -> None:
        """Mark the end of this step's backward (the first call of the step counts)."""
        if self._backward_end is not None:
            return
        if self.cuda:
            k = len(self._closed)
            if k == len(self._backward_events):
                self._backward_events.append(torch.cuda.Event(enable_timing=True))
            self._backward_events[k].record()
            self._backward_end = self._backward_events[k]
        else:
            self._backward_end = time.perf_counter()

    def close_step(self) -> None:
        """The step's collectives are all issued and waited for."""
        self._closed.append((self._used, self._backward_end))
        self._backward_end = None
        if len(self._closed) >= MAX_UNCOLLECTED_STEPS:  # nobody collects: keep memory bounded
            self._fold()

    # ---- reading --------------------------------------------------------------------------
    def collect(self) -> CommStats:
        """The stats of the closed steps since the last collect (CUDA: one event wait); then reset."""
        self._fold()
        stats, self.stats = self.stats, CommStats(clock=self._clock)
        return stats

    def _fold(self) -> None:
        if not self._closed:
            return
        if self.cuda:  # one host wait, behind every event of the closed steps
            self._stream.wait_stream(torch.cuda.current_stream(self.device))
            self._marker.record(self._stream)
            self._marker.synchronize()
            for range_id in self._open_ranges:
                nvtx_ranges.end(range_id)
            self._open_ranges.clear()
        first = 0
        for end, backward_end in self._closed:
            self._fold_step(first, end, backward_end)
            first = end
        self._closed.clear()
        self._generation += 1
        if first < self._used:  # collectives of a step still open: rotate their slots to the front
            for slots in (self._starts, self._ends, self._bytes):
                slots[:] = slots[first:] + slots[:first]
        self._used -= first

    def _fold_step(self, first: int, end: int, backward_end: BackwardEnd) -> None:
        if end == first:
            return
        if self.cuda:
            ref = self._starts[first]
            intervals = [
                (ref.elapsed_time(self._starts[i]) / 1e3, ref.elapsed_time(self._ends[i]) / 1e3)
                for i in range(first, end)
            ]
            cut = -float("inf") if backward_end is None else ref.elapsed_time(backward_end) / 1e3
        else:
            # An end never observed (no callback, no wait) counts as an instant collective.
            intervals = [
                (self._starts[i], self._ends[i] if self._ends[i] != float("inf") else self._starts[i])
                for i in range(first, end)
            ]
            for i in range(first, end):
                self._ends[i] = float("inf")
            cut = -float("inf") if backward_end is None else backward_end
        total, hidden = union_and_part_before(intervals, cut)
        self.stats.num_ops += end - first
        self.stats.bytes += sum(self._bytes[first:end])
        self.stats.in_flight_s += total
        self.stats.hidden_s += hidden
