"""Asynchronous handles for collectives written in Python from point-to-point messages.

torch's own collectives return a `Work` that the backend completes in the background. A Python
all-reduce built from isend/irecv needs a thread to run on instead, so every such collective of a
process runs on one dedicated worker thread, strictly in submission order. Because every rank
issues its collectives in the same order (the DDP contract), running them in that order keeps the
ranks' messages matched; blocking calls go through the same queue, so they stay ordered with
respect to async ones already in flight.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist


class P2PWork:
    """Work-like handle: `wait()` blocks until the job ran and re-raises its error; the result is the tensor."""

    def __init__(self) -> None:
        self._future: torch.futures.Future = torch.futures.Future()

    def wait(self, timeout: Any = None) -> bool:
        """Block until the collective finished (`timeout` is accepted for Work compatibility and ignored)."""
        self._future.wait()
        return True

    def is_completed(self) -> bool:
        return self._future.done()

    def get_future(self) -> torch.futures.Future:
        """A torch Future completed with the reduced tensor (or the job's exception)."""
        return self._future

    def result(self) -> torch.Tensor:
        return self._future.wait()


class _OrderedWorker:
    """One daemon thread running submitted jobs one at a time, first in, first out."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="p2p-collectives", daemon=True)
        self._thread.start()

    def submit(self, job: Callable[[], torch.Tensor]) -> P2PWork:
        work = P2PWork()
        if threading.current_thread() is self._thread:
            # Called from a job or a future's callback on this thread: queueing would wait on itself.
            self._complete(job, work)
        else:
            self._jobs.put((job, work))
        return work

    def _run(self) -> None:
        while True:
            self._complete(*self._jobs.get())

    @staticmethod
    def _complete(job: Callable[[], torch.Tensor], work: P2PWork) -> None:
        try:
            result = job()
        except BaseException as error:  # handed to whoever waits on the handle
            work.get_future().set_exception(error)
        else:
            work.get_future().set_result(result)


_worker: _OrderedWorker | None = None
_worker_lock = threading.Lock()


def _the_worker() -> _OrderedWorker:
    """The process's worker, started on first use (never in a process that only imports this module)."""
    global _worker
    with _worker_lock:
        if _worker is None:
            _worker = _OrderedWorker()
        return _worker


def staged_for_backend(
    sum_in_place: Callable[..., torch.Tensor], tensor: torch.Tensor, group: dist.ProcessGroup | None = None
) -> torch.Tensor:
    """Run `sum_in_place(tensor, group)`; over gloo, a CUDA tensor goes through a host copy.

    gloo's send/recv hand the raw data pointer to a host-memory transport (its collectives stage
    CUDA tensors themselves, its point-to-point calls do not), so the copy is made here.
    """
    if tensor.is_cuda and dist.get_backend(group) == "gloo":
        host = tensor.cpu()  # waits for the kernels that produced `tensor` on this thread's stream
        sum_in_place(host, group)
        return tensor.copy_(host)
    return sum_in_place(tensor, group)


def run_in_order(job: Callable[[], torch.Tensor], async_op: bool = False) -> torch.Tensor | P2PWork:
    """Run `job` after every collective submitted before it; return its result, or a P2PWork if async_op."""
    work = _the_worker().submit(job)
    if async_op:
        return work
    return work.result()


def p2p_all_reduce(sum_in_place: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor | P2PWork]:
    """The `ddp.comm.collectives` entry for `sum_in_place(tensor, group)`, an all-reduce written in Python:
    it runs on the process's worker thread, in issue order, staged for the backend.

    The entry returns the tensor, or with async_op=True a P2PWork handle (`wait()`, `get_future()`).
    """

    def all_reduce(
        tensor: torch.Tensor, group: dist.ProcessGroup | None = None, async_op: bool = False
    ) -> torch.Tensor | P2PWork:
        return run_in_order(lambda: staged_for_backend(sum_in_place, tensor, group), async_op=async_op)

    return all_reduce


def resolved_group(group: dist.ProcessGroup | None) -> dist.ProcessGroup:
    """`group`, or the default (world) group for None: what `dist.get_global_rank` needs."""
    resolved = group if group is not None else dist.group.WORLD
    if resolved is None:
        raise RuntimeError("torch.distributed is not initialised (no default process group)")
    return resolved


@contextlib.contextmanager
def contiguous_flat(tensor: torch.Tensor) -> Iterator[torch.Tensor]:
    """A 1-D view of `tensor` to sum into in place; for a non-contiguous tensor a contiguous copy,
    written back into `tensor` on exit."""
    in_place = tensor.is_contiguous()
    flat = tensor.view(-1) if in_place else tensor.contiguous().view(-1)
    yield flat
    if not in_place:
        tensor.copy_(flat.view_as(tensor))
