"""What every data-parallel wrapper shares: rank-0 broadcast, the parameters to synchronise, and
its all-reduces, named and timed (communication accounting).

Subclasses implement `_synchronize()`; callers use `finish_gradient_synchronization()` between
`loss.backward()` and `optimizer.step()`, after which each `.grad` is the mean over ranks.
Parameters that got no gradient follow the "had a gradient" protocol of ddp.grads.grad_flags.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from contract import ALL_REDUCE, GRAD_SYNC, comm_range
from ddp.comm import nvtx_ranges
from ddp.comm.collectives import COLLECTIVES, check_collective
from ddp.comm.instrumented import InFlight, Instrumented, broadcast_from_rank0, nbytes
from ddp.comm.timing import CommStats, CommTimer
from ddp.memory.accounting import MemoryParts, local, storage_bytes, storage_key


def named_trainable_parameters(module: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """Each parameter with requires_grad once (tied weights under their first name), in order."""
    return [(name, p) for name, p in module.named_parameters() if p.requires_grad]


def synchronize_device(tensor: torch.Tensor) -> None:
    """On CUDA, wait for queued kernels so host timers see the device's work; no-op on CPU.

    For step boundaries and benchmarks only: the wrappers never call it per collective.
    """
    if tensor.is_cuda:
        torch.cuda.synchronize(tensor.device)


def weak_method(method: Callable[..., None]) -> Callable[..., None]:
    """`method`, bound to a wrapper, called through a weak reference to it: a no-op once the wrapper is gone.

    For gradient hooks (`register_post_accumulate_grad_hook`): autograd keeps them in C++, where the cyclic
    garbage collector cannot see them, so a hook referring to its wrapper (or to anything that leads back to
    the hooked tensor) makes a cycle no collection frees: the wrapper, its model, gradients and buffers would
    stay allocated for the life of the process. A hook holds only this and plain values (indices, names).
    """
    ref = weakref.WeakMethod(method)

    def call(*args: Any) -> None:
        bound = ref()
        if bound is not None:
            bound(*args)

    return call


class PendingAllReduce:
    """An async all-reduce in flight (ddp.comm.instrumented.InFlight) and the tensor it sums in place."""

    __slots__ = ("flight", "tensor")

    def __init__(self, tensor: torch.Tensor, flight: InFlight):
        self.tensor, self.flight = tensor, flight

    def wait(self) -> torch.Tensor:
        """The reduced tensor; on CUDA only the streams wait (the host does not)."""
        self.flight.wait()
        return self.tensor


class DataParallelBase(nn.Module):
    """An nn.Module around `module` that averages gradients over the default process group."""

    def __init__(self, module: nn.Module, collective: str = "torch"):
        super().__init__()
        if not dist.is_initialized():
            raise RuntimeError(
                f"{type(self).__name__} needs torch.distributed initialised first (see ddp.launch.launcher.launch)"
            )
        self.module = module
        self.collective = check_collective(collective)
        self._all_reduce = COLLECTIVES[self.collective]
        self.group: dist.ProcessGroup | None = None  # the default (world) group
        self.world_size = dist.get_world_size()
        broadcast_from_rank0([*module.parameters(), *module.buffers()], "params", self.group)
        named = named_trainable_parameters(module)
        self.param_names = [n for n, _ in named]
        self.params = [p for _, p in named]
        # Every collective of the wrapper goes through it: timed in its CommTimer, named, tracked in flight.
        self.collectives = Instrumented(CommTimer(self.params[0].device if self.params else torch.device("cpu")))
        # One NVTX name per tag, built once: collectives are issued every step.
        self._range_names = {n: comm_range(ALL_REDUCE, n) for n in self.param_names}

    @property
    def comm(self) -> CommTimer:
        """The per-step timing of this wrapper's collectives (ddp.comm.timing)."""
        return self.collectives.timer

    @comm.setter
    def comm(self, timer: CommTimer) -> None:
        self.collectives.timer = timer

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def reset_comm_stats(self) -> CommStats:
        """The communication of the steps finished since the last reset (ddp.comm.timing).

        On CUDA this reads the steps' events after one event wait: call it after the step's own
        device synchronisation (as ddp.training.loop does) and it waits for nothing.
        """
        return self.comm.collect()

    def comm_layout(self) -> list[dict]:
        """One entry per collective of a step: {name: its tag, params: names, bytes: its payload}."""
        raise NotImplementedError

    @torch.no_grad()
    def gather_full_params(self) -> dict[str, torch.Tensor]:
        """Every parameter of `.module` in full under its name, copied (sharded strategies gather them:
        then every rank must call it)."""
        return {n: p.detach().clone() for n, p in self.module.named_parameters()}

    def sharded_layout(self) -> list[dict]:
        """The `contract.sharded_entry` of each sharded module, in forward order; none for replicated strategies."""
        return []

    # ---- memory accounting (ddp.memory.accounting; what ddp.benchmark and ddp.meta report) ----------
    def memory_parts(self) -> MemoryParts:
        """Bytes this rank holds for the wrapped model now, by part: the wrapper's own accounting.

        The contract every wrapper meets (each storage counted once, in the first part that holds it, from
        `untyped_storage().nbytes()`, so padding and whole buckets count and a storage resized to 0 does not):
        - `parameters`: what this rank stores of the model: its parameters (under FSDP the local shards,
          padded, and the replicated parameters) and the module's buffers;
        - `gradients`: the `.grad` of those parameters, as the optimizer sees them (a bucket whose views
          they are counts here whole);
        - `gathered`: `gathered_bytes()`, full-parameter buffers of a sharded strategy (0 when replicated);
        - `comm_buffers`: `comm_buffers()` beyond what the parts above hold (flat buffers, flags; fsdp's flat
          gradient buffers, cast send buffers and cast parameter copies);
        - `optimizer_state` and `activations` stay 0: they are not the wrapper's, ddp.training.loop
          fills them in (ShardedOptimizer's state is this rank's share; activations are what forward
          saves for backward, less what `holds_weights` claims).
        Call it after a step (gradients present, before the next zero_grad). Replicated wrappers keep
        this implementation and list their buffers in `comm_buffers()`; a sharded one makes
        `parameters()`/`.module`'s parameters its shards and implements `gathered_bytes`,
        `holds_weights` if needed, and `comm_buffers`, or overrides this method and keeps the same meanings.
        """
        seen: set[tuple[str, int]] = set()
        return MemoryParts(
            parameters=storage_bytes([*self.module.parameters(), *self.module.buffers()], seen),
            gradients=storage_bytes((p.grad for p in self.module.parameters()), seen),
            gathered=self.gathered_bytes(),
            comm_buffers=storage_bytes(self.comm_buffers(), seen),
        )

    def comm_buffers(self) -> list[torch.Tensor]:
        """The tensors this wrapper keeps for communicating between steps (flat buffers, buckets, flags)."""
        return []

    def gathered_bytes(self) -> int:
        """The most bytes of gathered full parameters alive at once in any step so far (a sharded
        strategy's high-water mark over its gather buffers, in the dtype on the wire: for `fsdp` with
        prefetch p the largest p units in a row); 0 for a replicated strategy."""
        return 0

    def holds_weights(self, tensor: torch.Tensor) -> bool:
        """Whether `tensor`, as forward saves it for backward, lies in weight memory this wrapper accounts
        (`parameters` or `gathered`), so that the activation count skips it: by default when it shares storage
        with one of `.module`'s parameters at that moment (a sharded strategy's gathered weights while the
        unit runs, as FSDP2 registers them). A sharded strategy whose gathered weights are not `.module`'s
        parameters during forward overrides it."""
        key = storage_key(local(tensor))
        return any(
            key == storage_key(local(p)) for p in self.module.parameters() if local(p).untyped_storage().nbytes()
        )

    def finish_gradient_synchronization(self) -> None:
        """Leave every trainable parameter's .grad equal to the mean over ranks."""
        self.comm.backward_ended()
        with nvtx_ranges.range(GRAD_SYNC):
            self._synchronize()
        self.comm.close_step()

    def _synchronize(self) -> None:
        raise NotImplementedError

    # ---- what the wrappers (and their buckets) communicate through ----------------------------
    def blocking_all_reduce(self, tensor: torch.Tensor, tag: str) -> torch.Tensor:
        """Sum `tensor` over ranks inside a `comm:all_reduce:<tag>` range (payload: its bytes).

        No host synchronisation: on NCCL the call only enqueues, as plain `dist.all_reduce` does.
        """
        self.collectives.blocking(self._range_name(tag), nbytes(tensor), lambda: self._sum(tensor, async_op=False))
        return tensor

    def async_all_reduce(self, tensor: torch.Tensor, tag: str) -> PendingAllReduce:
        """Start summing `tensor` over ranks inside a `comm:all_reduce:<tag>` start/end range (payload: its bytes)."""
        flight = self.collectives.start(self._range_name(tag), nbytes(tensor), lambda: self._sum(tensor, async_op=True))
        return PendingAllReduce(tensor, flight)

    def _sum(self, tensor: torch.Tensor, async_op: bool) -> Any:
        """The configured all-reduce of `tensor` (ddp.comm.collectives), in place: its handle when async."""
        return self._all_reduce(tensor, group=self.group, async_op=async_op)

    def _range_name(self, tag: str) -> str:
        name = self._range_names.get(tag)
        if name is None:
            name = self._range_names[tag] = comm_range(ALL_REDUCE, tag)
        return name


def check_same_dtype_and_device(params: Sequence[torch.Tensor], who: str) -> None:
    """Flat buffers hold one dtype on one device; say so clearly when parameters disagree."""
    kinds = {(p.dtype, p.device) for p in params}
    if len(kinds) > 1:
        raise ValueError(
            f"{who} needs all trainable parameters on one dtype and device, got "
            + ", ".join(f"{d}@{dev}" for d, dev in sorted(kinds, key=str))
        )
