"""OverlapDDP: each parameter's all-reduce issued asynchronously from its gradient hook, during backward."""
from __future__ import annotations

import torch
from torch import nn

from ddp.base import ACCUMULATION_ERROR, DataParallelBase, PendingAllReduce, carrier_last_order, nbytes


class OverlapDDP(DataParallelBase):
    """Per-parameter async all-reduces launched by `register_post_accumulate_grad_hook`.

    Collectives pair up across ranks by issue order, so they go out in one fixed order (reverse
    registration, roughly the order backward produces gradients): a gradient that is ready before
    its predecessors waits for them. The smallest parameter goes last, issued at
    `finish_gradient_synchronization()` with the step's "had a gradient" flags appended (in a
    buffer kept from step to step).
    """

    def __init__(self, module: nn.Module, collective: str = "torch"):
        super().__init__(module, collective)
        self.order = order = carrier_last_order(self.params)
        self._ready = [False] * len(order)
        self._pending: list[PendingAllReduce] = []
        self._next = 0  # position in `order` of the next collective to issue
        for pos, i in enumerate(order):
            self.params[i].register_post_accumulate_grad_hook(
                lambda _p, pos=pos: self._on_gradient_ready(pos))
        if order:
            carrier = self.params[order[-1]]
            self._packed = torch.empty(carrier.numel() + len(self.params), dtype=carrier.dtype,
                                       device=carrier.device)
            self._flags = self._packed[carrier.numel():]

    def comm_layout(self) -> list[dict]:
        return [{"name": self.param_names[i], "params": [self.param_names[i]],
                 "bytes": nbytes(self.params[i]) + (nbytes(self._flags) if i == self.order[-1] else 0)}
                for i in self.order]

    def _on_gradient_ready(self, pos: int) -> None:
        if self._ready[pos]:
            raise RuntimeError(ACCUMULATION_ERROR)
        self._ready[pos] = True
        while self._next < len(self.order) - 1 and self._ready[self._next]:
            self._issue(self._next)

    def _issue(self, pos: int) -> None:
        i = self.order[pos]
        grad = self._grad_or_zeros(self.params[i])
        self._pending.append(self._async_all_reduce(grad, self.param_names[i]))
        self._next = pos + 1

    @torch.no_grad()
    def _synchronize(self) -> None:
        if not self.order:
            return
        had_local = [p.grad is not None for p in self.params]
        self._write_flags(self._flags, had_local)
        while self._next < len(self.order) - 1:  # parameters whose hook never fired this step
            self._issue(self._next)
        carrier = self.order[-1]
        grad = self._grad_or_zeros(self.params[carrier])
        n = grad.numel()
        self._packed[:n].copy_(grad.reshape(-1))
        packed = self._async_all_reduce(self._packed, self.param_names[carrier])
        for pending in self._pending:
            pending.wait().div_(self.world_size)
        packed.wait()
        grad.copy_(self._packed[:n].view_as(grad)).div_(self.world_size)
        self._drop_unused(self.params, had_local, self._flags)
        for pos in range(len(self._ready)):
            self._ready[pos] = False
        self._pending.clear()
        self._next = 0
