"""The table of all-reduces every wrapper chooses from, and `all_reduce`, the door for callers outside a wrapper.

A *collective* here is a way to all-reduce, chosen by name ("torch", "ring", "reduce_broadcast"):
the wrappers' `collective=` argument and the CLIs' `--collective`.
`all_reduce(tensor, collective, group, async_op)` sums `tensor` in place over the group. Blocking
calls return the tensor; `async_op=True` returns a handle with `.wait()` and `.get_future()`.
"ring" and "reduce_broadcast" are built from point-to-point messages in their own modules and run
on one worker thread per process (ddp.comm.p2p_work).
Every call is recorded in `ddp.comm.inflight` under `name` (the NVTX range's, e.g. `comm:all_reduce:flat`),
so that a collective that never completes can be named in the error. The wrappers call the table's entries
through `ddp.comm.instrumented`, which records them (and times them, inside their NVTX ranges) the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, Protocol, overload

import torch
import torch.distributed as dist

from ddp.comm import inflight
from ddp.comm.p2p_work import p2p_all_reduce
from ddp.comm.reduce_broadcast import reduce_broadcast_all_reduce
from ddp.comm.ring_allreduce import ring_all_reduce


class Handle(Protocol):
    def wait(self) -> object: ...


def _torch_all_reduce(
    tensor: torch.Tensor, group: dist.ProcessGroup | None = None, async_op: bool = False
) -> torch.Tensor | Handle:
    work = dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group, async_op=async_op)
    return work if async_op else tensor


AllReduce = Callable[..., "torch.Tensor | Handle"]
COLLECTIVES: dict[str, AllReduce] = {
    "torch": _torch_all_reduce,
    "ring": p2p_all_reduce(ring_all_reduce),
    "reduce_broadcast": p2p_all_reduce(reduce_broadcast_all_reduce),
}


def check_collective(collective: str) -> str:
    """Return `collective` if registered, else raise ValueError naming the valid choices."""
    if collective not in COLLECTIVES:
        raise ValueError(f"unknown collective {collective!r}: choose from {', '.join(COLLECTIVES)}")
    return collective


@overload
def all_reduce(
    tensor: torch.Tensor,
    collective: str = ...,
    group: dist.ProcessGroup | None = ...,
    async_op: Literal[False] = ...,
    name: str = ...,
) -> torch.Tensor: ...
@overload
def all_reduce(
    tensor: torch.Tensor,
    collective: str = ...,
    group: dist.ProcessGroup | None = ...,
    *,
    async_op: Literal[True],
    name: str = ...,
) -> inflight.TrackedWork: ...
def all_reduce(
    tensor: torch.Tensor,
    collective: str = "torch",
    group: dist.ProcessGroup | None = None,
    async_op: bool = False,
    name: str = "all_reduce",
) -> torch.Tensor | inflight.TrackedWork:
    """Sum `tensor` in place across `group` with the named collective; `name` says which one in errors."""
    reduce = COLLECTIVES[check_collective(collective)]
    seq = inflight.begin(name)
    result = reduce(tensor, group=group, async_op=async_op)  # raising: stays open, for the error report
    if not async_op:
        inflight.end(seq)
        return tensor  # what every blocking collective returns: it summed in place
    return inflight.TrackedWork(result, seq)
