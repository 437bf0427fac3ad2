"""FlatDDP: after backward, every gradient flattened into one buffer and one blocking all-reduce."""
from __future__ import annotations

import torch
from torch import nn

from ddp.base import DataParallelBase, check_same_dtype_and_device


class FlatDDP(DataParallelBase):
    """One blocking all-reduce of [all gradients, "had a gradient" flags] per step."""

    def __init__(self, module: nn.Module, collective: str = "torch"):
        super().__init__(module, collective)
        check_same_dtype_and_device(self.params, type(self).__name__)

    @torch.no_grad()
    def _synchronize(self) -> None:
        if not self.params:
            return
        had_local = [p.grad is not None for p in self.params]
        flags = self._local_flags(self.params)
        grads = [self._grad_or_zeros(p).reshape(-1) for p in self.params]
        flat = self._blocking_all_reduce(torch.cat(grads + [flags]), "flat")
        n_grad = flat.numel() - flags.numel()
        for p, chunk in zip(self.params, flat[:n_grad].split([p.numel() for p in self.params])):
            torch.div(chunk.view_as(p), self.world_size, out=p.grad)  # average while copying out
        self._drop_unused(self.params, had_local, flat[n_grad:])
