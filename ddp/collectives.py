"""The one door every wrapper's all-reduce goes through, with a table of algorithms behind it.

`all_reduce(tensor, algorithm, group, async_op)` sums `tensor` in place over the group. Blocking
calls return the tensor; `async_op=True` returns a handle with `.wait()` and `.get_future()`.
"ring" and "reduce_broadcast" are built from point-to-point messages in their own modules.
"""
from __future__ import annotations

from typing import Callable, Protocol

import torch
import torch.distributed as dist

from ddp import reduce_broadcast, ring_allreduce


class Handle(Protocol):
    def wait(self) -> object: ...


def _torch_all_reduce(tensor: torch.Tensor, group=None, async_op: bool = False):
    work = dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group, async_op=async_op)
    return work if async_op else tensor


AllReduce = Callable[..., "torch.Tensor | Handle"]
ALGORITHMS: dict[str, AllReduce] = {"torch": _torch_all_reduce, "ring": ring_allreduce.all_reduce,
                                     "reduce_broadcast": reduce_broadcast.all_reduce}


def check_algorithm(algorithm: str) -> str:
    """Return `algorithm` if registered, else raise ValueError naming the valid choices."""
    if algorithm not in ALGORITHMS:
        valid = ", ".join(sorted(ALGORITHMS))
        raise ValueError(f"unknown collective algorithm {algorithm!r}: choose one of {valid}")
    return algorithm


def all_reduce(tensor: torch.Tensor, algorithm: str = "torch", group=None, async_op: bool = False):
    """Sum `tensor` in place across `group` with the named algorithm."""
    return ALGORITHMS[check_algorithm(algorithm)](tensor, group=group, async_op=async_op)
