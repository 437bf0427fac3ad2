"""NaiveDDP: after backward, one blocking all-reduce per parameter."""

from __future__ import annotations

import torch
from torch import nn

from ddp.grads.grad_flags import FlagCarrier
from ddp.strategies.base import DataParallelBase


class NaiveDDP(DataParallelBase):
    """One blocking all-reduce per trainable parameter, in reverse registration order.

    The smallest parameter goes last and carries the step's "had a gradient" flags appended to it
    (ddp.grads.grad_flags.FlagCarrier), so the count of collectives stays one per parameter.
    """

    def __init__(self, module: nn.Module, collective: str = "torch"):
        super().__init__(module, collective)
        self.carrier = FlagCarrier(self.params) if self.params else None

    def comm_buffers(self) -> list[torch.Tensor]:
        return [self.carrier.buffer] if self.carrier else []

    def comm_layout(self) -> list[dict]:
        return self.carrier.layout(self.param_names) if self.carrier else []

    @torch.no_grad()
    def _synchronize(self) -> None:
        carrier = self.carrier
        if carrier is None:  # no trainable parameter
            return
        flags = carrier.flags
        flags.write_present()
        for i in carrier.order[:-1]:
            self.blocking_all_reduce(flags.grad_or_zeros(i), self.param_names[i])
        self.blocking_all_reduce(carrier.pack(), self.param_names[carrier.index])
        carrier.unpack()
        for i in range(len(self.params)):
            flags.grad_or_zeros(i).div_(self.world_size)  # every parameter holds one by now
        flags.drop_unused()
