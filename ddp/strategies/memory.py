"""Memory accounting: the bytes one rank holds for training, by part, counted from the tensors themselves.

Each storage is counted once, in the first part that holds it (parameters, then gradients, then
communication buffers): a gradient that is a view into a bucket buffer is counted as a gradient, and
the bucket only for what lies beyond the gradients (its flags).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass

import torch

MIB = 2**20


@dataclass
class MemoryParts:
    """Bytes one rank holds, by part (what `ddp.benchmark` reports per rank)."""

    parameters: int = 0  # the parameters this rank stores (a shard under FSDP) and module buffers
    gradients: int = 0  # .grad tensors as the optimizer sees them
    optimizer_state: int = 0  # tensors in the optimizer's state (this rank's share when sharded)
    gathered: int = 0  # full-parameter buffers of a sharded strategy, the most live at once
    comm_buffers: int = 0  # the wrapper's own communication buffers (flat buffers, buckets, flags)
    activations: int = 0  # tensors forward saved for backward (parameters and gradients excepted)

    @property
    def total(self) -> int:
        """The sum of the parts: the peak if they all coexist (activations and a step's gradients only
        partly do, as backward frees the one while it makes the other), so an upper bound of it."""
        return sum(asdict(self).values())

    def as_mib(self) -> dict[str, float]:
        return {**{k: round(v / MIB, 3) for k, v in asdict(self).items()}, "total": round(self.total / MIB, 3)}


def storage_key(tensor: torch.Tensor) -> tuple[str, int]:
    storage = tensor.untyped_storage()
    return str(tensor.device), storage.data_ptr()


def storage_bytes(tensors: Iterable[torch.Tensor | None], seen: set[tuple[str, int]]) -> int:
    """Bytes of the storages behind `tensors` not in `seen` (each once; `seen` is updated)."""
    total = 0
    for t in tensors:
        if t is None or t.untyped_storage().nbytes() == 0:
            continue
        key = storage_key(t)
        if key not in seen:
            seen.add(key)
            total += t.untyped_storage().nbytes()
    return total


class SavedTensorBytes:
    """Context manager counting the bytes of the tensors autograd saves for backward inside it (each
    storage once), except those of `exclude` (parameters, gradients): the activations of a step."""

    def __init__(self, exclude: Iterable[torch.Tensor | None] = ()):
        self._seen: set[tuple[str, int]] = set()
        storage_bytes(exclude, self._seen)
        self.bytes = 0
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        self.bytes += storage_bytes([tensor], self._seen)
        return tensor

    def __enter__(self) -> SavedTensorBytes:
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._hooks.__exit__(*exc)
