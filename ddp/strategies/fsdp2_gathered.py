"""The gathered memory of `torch_fsdp` (ddp.strategies.torch_fsdp): what PyTorch's FSDP2 holds of full
parameters, counted from its own objects (torch 2.13's `torch.distributed.fsdp._fully_shard`).

FSDP2 gathers a unit in two kinds of tensors:
- the *all-gather output*, one flat buffer per unit and all-gather (every rank's padded shards end to end, in
  the dtype on the wire), allocated through the custom all-gather's `allocate` (ours: TimedAllGather) and
  dropped after its copy-out: in backward at once, in forward only once the next unit's all-gather has been
  waited for (FSDP2 keeps it so that the next all-gather may overlap the copy-out);
- each parameter's *unsharded copy*: `FSDPParam.all_gather_outputs` (the storage behind the `_unsharded_param`
  the module computes with), allocated by `alloc_all_gather_outputs()` during the copy-out and resized to
  0 bytes by `free_unsharded_param()` when the unit reshards: after its forward (all units but the root,
  which keeps its parameters unsharded from forward to backward) and after its backward.

`GatheredMemory` follows both: the flat buffers from allocation until they are garbage, the unsharded copies
by their storages' sizes after each `alloc_all_gather_outputs()` and `free_unsharded_param()` (wrapped on each
FSDPParam instance), and keeps the most bytes alive at once. Gathered memory only grows at those two points
(a flat buffer allocated, a parameter's copy allocated), so the high-water mark is exact for these tensors.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable
from typing import Any

import torch

from ddp.strategies.base import nbytes


class GatheredMemory:
    """Bytes of FSDP2's all-gather outputs and unsharded parameter copies alive now (`live`), the most alive
    at once so far (`peak`)."""

    def __init__(self, fsdp_params: Iterable[Any]):
        self.flat = 0  # all-gather outputs alive
        self.unsharded = 0  # unsharded parameter copies alive
        self.peak = 0
        self._counted: dict[int, int] = {}  # id(FSDPParam) -> bytes of its copies counted in `unsharded`
        for fsdp_param in fsdp_params:
            fsdp_param.alloc_all_gather_outputs = self._recount_after(fsdp_param, fsdp_param.alloc_all_gather_outputs)
            fsdp_param.free_unsharded_param = self._recount_after(fsdp_param, fsdp_param.free_unsharded_param)

    @property
    def live(self) -> int:
        return self.flat + self.unsharded

    def track_flat(self, buffer: torch.Tensor) -> torch.Tensor:
        """Count `buffer` (an all-gather output) as alive until it is garbage."""
        size = nbytes(buffer)
        self.flat += size
        self._sample()
        weakref.finalize(buffer, self._drop_flat, size)
        return buffer

    def _drop_flat(self, size: int) -> None:
        self.flat -= size

    def _recount_after(self, fsdp_param: Any, method: Callable[[], None]) -> Callable[[], None]:
        def recount() -> None:
            method()
            tensors = [*fsdp_param.all_gather_outputs, *getattr(fsdp_param, "_unsharded_inner_tensors", ())]
            now = sum(t.untyped_storage().nbytes() for t in tensors)
            self.unsharded += now - self._counted.get(id(fsdp_param), 0)
            self._counted[id(fsdp_param)] = now
            self._sample()

        return recount

    def _sample(self) -> None:
        self.peak = max(self.peak, self.live)


def fsdp_params_of(modules: Iterable[torch.nn.Module]) -> list[Any]:
    """The FSDPParam objects of the modules `fully_shard` was applied to (each module's param groups)."""
    return [
        fsdp_param
        for module in modules
        for group in module._get_fsdp_state()._fsdp_param_groups  # type: ignore[operator]
        for fsdp_param in group.fsdp_params
    ]
