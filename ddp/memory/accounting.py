"""Memory accounting: the bytes one rank holds for training, by part, counted from the tensors themselves.

The wrappers count their own parts (DataParallelBase.memory_parts: the contract), ddp.training.loop adds
the optimizer's state and the activations; docs/memory.md gives the formula each strategy follows.

Each storage is counted once, in the first part that holds it (parameters, then gradients, then
communication buffers): a gradient that is a view into a bucket buffer is counted as a gradient, and
the bucket only for what lies beyond the gradients (its flags).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, fields

import torch

from contract import MEMORY_PARTS, MEMORY_PEAK

MIB = 2**20


@dataclass
class MemoryParts:
    """Bytes one rank holds, by part (what `ddp.benchmark` reports per rank)."""

    parameters: int = 0  # the parameters this rank stores (a shard under FSDP) and module buffers
    gradients: int = 0  # .grad tensors as the optimizer sees them
    optimizer_state: int = 0  # tensors in the optimizer's state (this rank's share when sharded)
    # full-parameter buffers of a sharded strategy, the most live at once; None where they cannot be counted
    # (torch_fsdp on a torch whose FSDP2 keeps its parameters elsewhere: ddp.memory.fsdp2_gathered)
    gathered: int | None = 0
    comm_buffers: int = 0  # the wrapper's own communication buffers (flat buffers, buckets, flags)
    activations: int = 0  # tensors forward saved for backward (parameters and gradients excepted)

    @property
    def peak(self) -> int | None:
        """The accounted peak: the sum of the parts (None when a part is unknown). The true peak of these
        tensors is at most this: all parts coexist but activations and gradients, which only partly do
        (backward frees the one while it makes the other; zero_grad(set_to_none) drops the gradients before
        forward)."""
        parts = asdict(self).values()
        return None if None in parts else sum(parts)

    def as_bytes(self) -> dict[str, int | None]:
        """The parts and `peak`, in bytes, None where unknown (what ddp.meta records under `memory`:
        contract.MEMORY_PARTS)."""
        return {**asdict(self), MEMORY_PEAK: self.peak}

    def as_mib(self) -> dict[str, float | None]:
        """The parts and `peak`, in MiB (3 decimals), None where unknown."""
        return {k: mib(v) for k, v in self.as_bytes().items()}


def mib(size: int | None) -> float | None:
    """Bytes in MiB (3 decimals); None stays None (a part that could not be counted)."""
    return None if size is None else round(size / MIB, 3)


assert tuple(f.name for f in fields(MemoryParts)) == MEMORY_PARTS, "the contract names the parts ddp.meta records"


def local(tensor: torch.Tensor) -> torch.Tensor:
    """What this rank stores of `tensor`: a DTensor's local shard (FSDP2's parameters, their gradients and
    optimizer state), any other tensor as it is. (Told by its `to_local`: importing DTensor to ask would cost
    every rank FSDP2's imports, ddp.strategies.registry.)"""
    to_local = getattr(tensor, "to_local", None)
    return tensor if to_local is None else to_local()


def storage_key(tensor: torch.Tensor) -> tuple[str, int]:
    return str(tensor.device), tensor.untyped_storage().data_ptr()


def storage_bytes(tensors: Iterable[torch.Tensor | None], seen: set[tuple[str, int]]) -> int:
    """Bytes of the storages behind `tensors` (DTensors: their local shards) not in `seen` (each once; `seen`
    is updated); a storage resized to 0 bytes counts nothing."""
    total = 0
    for t in tensors:
        if t is None:
            continue
        t = local(t)
        if t.untyped_storage().nbytes() == 0:
            continue
        key = storage_key(t)
        if key not in seen:
            seen.add(key)
            total += t.untyped_storage().nbytes()
    return total


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of the tensors in `optimizer.state` (each storage once; ShardedOptimizer's: this rank's share)."""
    return storage_bytes(
        (v for per_param in optimizer.state.values() for v in per_param.values() if torch.is_tensor(v)), set()
    )


class SavedTensorBytes:
    """Context manager counting the bytes of the tensors autograd saves for backward inside it (each
    storage once): the activations of a step. Storages of `exclude` (parameters, buffers) are not
    counted, nor tensors for which `skip(tensor)` is true (a sharded wrapper's gathered weights)."""

    def __init__(
        self, exclude: Iterable[torch.Tensor | None] = (), skip: Callable[[torch.Tensor], bool] = lambda _t: False
    ):
        self._seen: set[tuple[str, int]] = set()
        storage_bytes(exclude, self._seen)
        self._skip = skip
        self.bytes = 0
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        if not self._skip(tensor):
            self.bytes += storage_bytes([tensor], self._seen)
        return tensor

    def __enter__(self) -> SavedTensorBytes:
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._hooks.__exit__(*exc)
