"""NaiveDDP: after backward, one blocking all-reduce per parameter."""
from __future__ import annotations

import torch
from torch import nn

from ddp.base import DataParallelBase, carrier_last_order, nbytes


class NaiveDDP(DataParallelBase):
    """One blocking all-reduce per trainable parameter, in reverse registration order.

    The smallest parameter goes last and carries the step's "had a gradient" flags appended to it
    (in a buffer kept from step to step), so the count of collectives stays one per parameter.
    """

    def __init__(self, module: nn.Module, collective: str = "torch"):
        super().__init__(module, collective)
        self.order = carrier_last_order(self.params)
        if self.order:
            carrier = self.params[self.order[-1]]
            self._packed = torch.empty(carrier.numel() + len(self.params), dtype=carrier.dtype,
                                       device=carrier.device)
            self._flags = self._packed[carrier.numel():]

    def comm_layout(self) -> list[dict]:
        return [{"name": self.param_names[i], "params": [self.param_names[i]],
                 "bytes": nbytes(self.params[i]) + (nbytes(self._flags) if i == self.order[-1] else 0)}
                for i in self.order]

    @torch.no_grad()
    def _synchronize(self) -> None:
        if not self.order:
            return
        had_local = [p.grad is not None for p in self.params]
        self._write_flags(self._flags, had_local)
        *body, carrier = self.order
        for i in body:
            self._blocking_all_reduce(self._grad_or_zeros(self.params[i]), self.param_names[i])
        grad = self._grad_or_zeros(self.params[carrier])
        n = grad.numel()
        self._packed[:n].copy_(grad.reshape(-1))
        self._blocking_all_reduce(self._packed, self.param_names[carrier])
        grad.copy_(self._packed[:n].view_as(grad))
        for p in self.params:
            p.grad.div_(self.world_size)
        self._drop_unused(self.params, had_local, self._flags)
