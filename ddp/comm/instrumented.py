"""The one call every wrapper issues its collectives through: timed, named in NVTX, tracked in flight.

A strategy says what to send (`issue`, a function that calls the collective) and under which contract name;
`Instrumented` does the accounting around it, in one order for every collective:
- its CommTimer slot (ddp.comm.timing): `begin` before the issue; a blocking call's end after it returns, an
  async one's at completion (its future's callback, its wait, or a poll: ddp.comm.completion_poll);
- its NVTX range (ddp.comm.nvtx_ranges) with the byte count as payload: a push/pop range around a blocking
  call, a start/end range for an async one, ended where the timer sees it complete (on CUDA at `collect`);
- its record in ddp.comm.inflight, so that a collective that never completes is named in the error.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from contract import BROADCAST, comm_range
from ddp.comm import inflight, nvtx_ranges
from ddp.comm.completion_poll import CompletionPoll, FutureLess, has_future
from ddp.comm.timing import CommTimer


class InFlight:
    """An async collective issued by `Instrumented.start`: its timer slot, its tracked handle and, for a handle
    without a future (gloo's reduce-scatter), the poll that watches it."""

    __slots__ = ("future", "poll", "slot", "timer", "work")

    def __init__(self, timer: CommTimer, slot: int, work: Any, poll: CompletionPoll | None = None):
        self.timer, self.slot, self.work, self.poll = timer, slot, work, poll
        self.future: Any = None  # with `then`: the future handed on (DDP's comm hook returns it)

    def wait(self) -> None:
        """Wait for it: the host on CPU; on CUDA only the streams (ddp.comm.timing.CommTimer.wait)."""
        self.timer.wait(self.slot, self.work)
        if self.poll is not None:  # its interval and range end here if no poll saw it complete first
            self.poll.settle(self.work)

    def is_completed(self) -> bool:
        """Whether the host has seen it complete (never waits)."""
        return bool(self.work.is_completed())


class Instrumented:
    """Issues one owner's collectives (see the module docstring); `timer` holds their per-step timing.

    `poll` (fsdp's) watches async handles that have no future on the host; without one every async handle
    must have a future, or run on CUDA.
    """

    def __init__(self, timer: CommTimer, poll: CompletionPoll | None = None):
        self.timer, self.poll = timer, poll

    def blocking(self, name: str, size: int, issue: Callable[[], object]) -> None:
        """Run `issue()` (a blocking collective of `size` bytes) inside push/pop range `name`, timed and tracked."""
        with nvtx_ranges.range(name, payload=size):
            slot = self.timer.begin(size)
            seq = inflight.begin(name)
            issue()  # raising: stays open in inflight, for the error report
            inflight.end(seq)
            self.timer.end_blocking(slot)

    def start(
        self,
        name: str,
        size: int,
        issue: Callable[[], Any],
        *,
        also: str | None = None,
        then: Callable[[Any], Any] | None = None,
    ) -> InFlight:
        """Issue `issue()` (an async collective of `size` bytes, returning its handle) inside start/end range
        `name`, timed and tracked. `also`: a second range (no payload) opened with it and ended with it.
        `then`: completion is recorded in a callback chained on the handle's future, whose result is
        `then(future)`; that chained future is the InFlight's `future` (DDP's comm hook hands it back to DDP).
        """
        slot = self.timer.begin(size)
        range_id = nvtx_ranges.start(name, payload=size)
        ranges = (range_id,) if also is None else (range_id, nvtx_ranges.start(also))
        seq = inflight.begin(name)
        work = issue()  # raising: stays open in inflight, for the error report
        if then is not None:
            tracked = inflight.TrackedWork(work, seq)
            record = self.timer.on_completion(slot, *ranges)

            def done(fut: Any) -> Any:
                record(fut)
                return then(fut)

            flight = InFlight(self.timer, slot, tracked)
            flight.future = tracked.get_future().then(done)
            return flight
        if self.poll is None or has_future(work) or self.timer.cuda:
            tracked = inflight.TrackedWork(work, seq)
            self.timer.track_async(slot, tracked, *ranges)
            return InFlight(self.timer, slot, tracked)
        tracked = inflight.TrackedWork(FutureLess(work), seq)
        self.poll.watch(tracked, self.timer.on_completion(slot, *ranges))
        return InFlight(self.timer, slot, tracked, self.poll)


def nbytes(tensor: torch.Tensor) -> int:
    """The bytes of `tensor`'s elements (a collective's payload)."""
    return tensor.numel() * tensor.element_size()


def broadcast_from_rank0(tensors: Sequence[torch.Tensor], tag: str, group: dist.ProcessGroup | None = None) -> None:
    """Copy rank 0's `tensors` into every rank's inside a `comm:broadcast:<tag>` range (payload: their bytes).

    Set-up, not a step's communication: untimed, and not tracked in flight.
    """
    size = sum(nbytes(t) for t in tensors)
    with nvtx_ranges.range(comm_range(BROADCAST, tag), payload=size), torch.no_grad():
        for t in tensors:
            dist.broadcast(t.data, src=0, group=group)
