"""Completion of collectives whose handle has no future (gloo's reduce-scatter: its `Work.get_future()`
raises "not implemented"), observed by polling `Work.is_completed()` on the issuing thread.

Waiting for such a handle from a second thread (one watcher thread per owner) corrupted results in gloo's
reduce-scatter about every other run of the FSDP tests, so nothing here waits: the owner calls `poll()` at
points it passes anyway (its hooks), and a collective's interval and NVTX range end at the first poll that
finds it complete, or at the owner's own wait, whichever comes first.

On gloo (torch 2.13) that is the wait: its reduce-scatter reports `is_completed()` False until waited for
(measured: still False 0.5 s after issue on 2 ranks), and it is not fully asynchronous either: on 64 MiB the
call itself took 0.44 s and the wait 0.30 s more after a 3 s sleep. So on CPU a reduce-scatter range spans
issue to the owner's wait (fsdp's: in backward when a later unit needs the gradient buffer it reads, else in
`finish_gradient_synchronization()`). NCCL's has a future: there it ends at completion.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def has_future(work: Any) -> bool:
    """Whether `work.get_future()` works (gloo raises for some collectives instead of lacking the method)."""
    try:
        work.get_future()
    except (AttributeError, RuntimeError):
        return False
    return True


class FutureLess:
    """A handle without `get_future` around one whose `get_future` raises (what ddp.comm.inflight expects)."""

    def __init__(self, work: Any):
        self._work = work

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        return self._work.wait(*args, **kwargs)

    def is_completed(self) -> bool:
        return bool(self._work.is_completed())


class CompletionPoll:
    """`watch(work, callback)`; `poll()` calls `callback(None)` once for each watched `work` now complete,
    `settle(work)` once `work.wait()` returned (the callback then runs if no poll ran it yet)."""

    def __init__(self) -> None:
        self._watched: list[tuple[Any, Callable[[Any], None]]] = []

    def watch(self, work: Any, callback: Callable[[Any], None]) -> None:
        self._watched.append((work, callback))

    def poll(self) -> None:
        if not self._watched:
            return
        still = []
        for work, callback in self._watched:
            if work.is_completed():
                callback(None)
            else:
                still.append((work, callback))
        self._watched = still

    def settle(self, work: Any) -> None:
        for k, (watched, callback) in enumerate(self._watched):
            if watched is work:
                del self._watched[k]
                callback(None)
                return
