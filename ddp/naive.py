"""NaiveDDP: after backward, one blocking all-reduce per parameter."""
from __future__ import annotations

import torch
from torch import nn

from ddp.base import DataParallelBase, carrier_last_order


class NaiveDDP(DataParallelBase):
    """One blocking all-reduce per trainable parameter, in reverse registration order.

    The smallest parameter goes last and carries the step's "had a gradient" flags appended to it,
    so the count of collectives stays one per parameter.
    """

    def __init__(self, module: nn.Module, collective: str = "torch"):
        super().__init__(module, collective)
        self.order = carrier_last_order(self.params)

    @torch.no_grad()
    def _synchronize(self) -> None:
        if not self.order:
            return
        had_local = [p.grad is not None for p in self.params]
        flags = self._local_flags(self.params)
        *body, carrier = self.order
        for i in body:
            self._blocking_all_reduce(self._grad_or_zeros(self.params[i]), self.param_names[i])
        grad = self._grad_or_zeros(self.params[carrier])
        packed = self._blocking_all_reduce(torch.cat([grad.reshape(-1), flags]),
                                           self.param_names[carrier])
        grad.copy_(packed[:grad.numel()].view_as(grad))
        for p in self.params:
            p.grad.div_(self.world_size)
        self._drop_unused(self.params, had_local, packed[grad.numel():])
