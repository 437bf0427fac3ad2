"""The flat float32 gradient buffers of `fsdp` (ddp.strategies.fsdp): a few, allocated once, that the units
take in turn.

A unit's backward writes its gradient into a buffer (ddp.sharding.unit_state.Unflatten), the unit
reduce-scatters it from there, and the buffer serves another unit once that reduce-scatter has completed.
Units take buffers in backward order, so `keep` buffers let the reduce-scatters of the `keep - 1` units
before run under the current unit's backward. When a unit needs one and all `keep` are taken, it waits
for the oldest reduce-scatter in flight (the owner's `reclaim`) rather than allocate; only when every
buffer belongs to a unit whose gradient is still being accumulated (a module called again later in
forward holds its buffer until its last use's backward) is another allocated, and that happens in the
first step: later steps find the same pattern and allocate nothing.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

KEEP = 2  # the current unit's buffer, and one more whose reduce-scatter runs under the current unit's backward


class GradientBuffers:
    """`take(owner)`: a buffer of `numel` elements (the largest unit's padded size) for `owner` until
    `give_back(owner)`. `reclaim()` (the FSDP wrapper's) waits for the oldest reduce-scatter in flight and
    gives its buffer back, or returns False when none is in flight."""

    def __init__(
        self, numel: int, dtype: torch.dtype, device: torch.device, reclaim: Callable[[], bool], keep: int = KEEP
    ):
        self.numel, self.dtype, self.device, self.keep = numel, dtype, device, keep
        self._reclaim = reclaim
        self.buffers: list[torch.Tensor] = []
        self._owners: list[object | None] = []

    def take(self, owner: object) -> torch.Tensor:
        """A free buffer for `owner` (waiting for a reduce-scatter if all `keep` are taken)."""
        k = self._free()
        if k is None and len(self.buffers) >= self.keep and self._reclaim():
            k = self._free()
        if k is None:  # fewer than `keep` so far, or every buffer still accumulates a unit's gradient
            self.buffers.append(torch.empty(self.numel, dtype=self.dtype, device=self.device))
            self._owners.append(None)
            k = len(self.buffers) - 1
        self._owners[k] = owner
        return self.buffers[k]

    def give_back(self, owner: object) -> None:
        for k, held_by in enumerate(self._owners):
            if held_by is owner:
                self._owners[k] = None
                return
        raise AssertionError("give_back of a buffer not taken")

    def _free(self) -> int | None:
        return next((k for k, owner in enumerate(self._owners) if owner is None), None)
