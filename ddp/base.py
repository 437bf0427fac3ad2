"""What every data-parallel wrapper shares: rank-0 broadcast, the parameters to synchronise,
communication accounting, and the bookkeeping for parameters that got no gradient.

Subclasses implement `_synchronize()`; callers use `finish_gradient_synchronization()` between
`loss.backward()` and `optimizer.step()`, after which each `.grad` is the mean over ranks.

Missing gradients: a parameter with no local gradient is sent as zeros, so every rank issues the
same collectives in the same order, and its "had a gradient" flag (1 or 0) travels in one of the
step's collectives. A parameter no rank had a gradient for goes back to `grad=None`, exactly as in
single-process training; one that some ranks had gets the mean with zeros from the others.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from ddp import nvtx_ranges
from ddp.collectives import all_reduce, check_algorithm


# Hook-driven wrappers send a gradient as soon as backward produces it; a second backward would add
# into a tensor that is already on the wire.
ACCUMULATION_ERROR = ("a parameter's gradient arrived twice before finish_gradient_synchronization(): "
                      "call it after every backward (gradient accumulation is not supported)")


@dataclass
class CommStats:
    """One step's communication: collective calls issued and seconds the caller was blocked."""
    num_ops: int = 0
    comm_time_s: float = 0.0


def named_trainable_parameters(module: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """Each parameter with requires_grad once (tied weights under their first name), in order."""
    return [(name, p) for name, p in module.named_parameters() if p.requires_grad]


def carrier_last_order(params: list[torch.Tensor]) -> list[int]:
    """Per-parameter issue order: reverse registration, with the smallest parameter moved last.

    The last collective of a step carries the "had a gradient" flags appended to its parameter.
    """
    order = list(range(len(params)))[::-1]
    if order:
        carrier = min(order, key=lambda i: params[i].numel())
        order.remove(carrier)
        order.append(carrier)
    return order


def broadcast_from_rank0(module: nn.Module, group=None) -> None:
    """Copy rank 0's parameters and buffers (trainable or not) into every rank's module."""
    tensors = list(module.parameters()) + list(module.buffers())
    with nvtx_ranges.range("comm:broadcast:params"), torch.no_grad():
        for t in tensors:
            dist.broadcast(t.data, src=0, group=group)


def synchronize_device(tensor: torch.Tensor) -> None:
    """On CUDA, wait for queued kernels so host timers see the device's work; no-op on CPU."""
    if tensor.is_cuda:
        torch.cuda.synchronize(tensor.device)


class PendingAllReduce:
    """An async all-reduce in flight: its NVTX start/end range and the wait that is timed."""

    def __init__(self, owner: "DataParallelBase", tensor: torch.Tensor, tag: str):
        self.owner, self.tensor = owner, tensor
        self.range_id = nvtx_ranges.start(f"comm:all_reduce:{tag}")
        self.work = all_reduce(tensor, owner.collective, group=owner.group, async_op=True)
        owner.comm_stats.num_ops += 1
        self.range_open = True
        # On CPU the future completes when the data is reduced, so ending the range in its callback
        # (on the comm thread) records the true in-flight interval. CUDA futures complete when the
        # work is queued, so there the range ends at the wait instead.
        if tensor.is_cpu and hasattr(self.work, "get_future"):
            self.range_open = False
            self.work.get_future().then(lambda _fut, rid=self.range_id: nvtx_ranges.end(rid))

    def wait(self) -> torch.Tensor:
        t0 = time.perf_counter()
        self.work.wait()
        synchronize_device(self.tensor)
        self.owner.comm_stats.comm_time_s += time.perf_counter() - t0
        if self.range_open:
            nvtx_ranges.end(self.range_id)
            self.range_open = False
        return self.tensor


class DataParallelBase(nn.Module):
    """An nn.Module around `module` that averages gradients over the default process group."""

    def __init__(self, module: nn.Module, collective: str = "torch"):
        super().__init__()
        if not dist.is_initialized():
            raise RuntimeError(f"{type(self).__name__} needs torch.distributed initialised first "
                               "(see ddp.launcher.launch)")
        self.module = module
        self.collective = check_algorithm(collective)
        self.group = None
        self.world_size = dist.get_world_size()
        broadcast_from_rank0(module, self.group)
        named = named_trainable_parameters(module)
        self.param_names = [n for n, _ in named]
        self.params = [p for _, p in named]
        self.comm_stats = CommStats()

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def reset_comm_stats(self) -> CommStats:
        """Return the stats gathered since the last reset and start a new count."""
        stats, self.comm_stats = self.comm_stats, CommStats()
        return stats

    def finish_gradient_synchronization(self) -> None:
        """Leave every trainable parameter's .grad equal to the mean over ranks."""
        with nvtx_ranges.range("grad_sync"):
            self._synchronize()

    def _synchronize(self) -> None:
        raise NotImplementedError

    # ---- helpers for subclasses -------------------------------------------------------------
    def _blocking_all_reduce(self, tensor: torch.Tensor, tag: str) -> torch.Tensor:
        """Sum `tensor` over ranks now, timed and inside a `comm:all_reduce:<tag>` range."""
        t0 = time.perf_counter()
        with nvtx_ranges.range(f"comm:all_reduce:{tag}"):
            all_reduce(tensor, self.collective, group=self.group)
            synchronize_device(tensor)
        self.comm_stats.num_ops += 1
        self.comm_stats.comm_time_s += time.perf_counter() - t0
        return tensor

    def _async_all_reduce(self, tensor: torch.Tensor, tag: str) -> PendingAllReduce:
        return PendingAllReduce(self, tensor, tag)

    def _grad_or_zeros(self, p: torch.Tensor) -> torch.Tensor:
        """The local gradient, after giving a parameter without one a zero gradient."""
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        return p.grad

    def _local_flags(self, params: list[torch.Tensor]) -> torch.Tensor:
        """1.0 for each parameter with a local gradient, 0.0 otherwise (summed over ranks later)."""
        ref = params[0]
        return torch.tensor([0.0 if p.grad is None else 1.0 for p in params], dtype=ref.dtype,
                            device=ref.device)

    @staticmethod
    def _drop_unused(params: list[torch.Tensor], had_local: list[bool], counts: torch.Tensor) -> None:
        """Back to grad=None for a parameter no rank had a gradient for (counts summed over ranks)."""
        if all(had_local):
            return  # every count is >= 1: nothing to read, and no device sync for it
        for p, had, count in zip(params, had_local, counts.tolist()):
            if not had and count == 0:
                p.grad = None


def check_same_dtype_and_device(params: list[torch.Tensor], who: str) -> None:
    """Flat buffers hold one dtype on one device; say so clearly when parameters disagree."""
    kinds = {(p.dtype, p.device) for p in params}
    if len(kinds) > 1:
        raise ValueError(f"{who} needs all trainable parameters on one dtype and device, got "
                         + ", ".join(f"{d}@{dev}" for d, dev in sorted(kinds, key=str)))
