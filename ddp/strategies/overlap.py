"""OverlapDDP (registry name `overlap`): each parameter's all-reduce issued asynchronously from
its gradient hook, during backward."""

from __future__ import annotations

import torch
from torch import nn

from ddp.grads.grad_flags import ACCUMULATION_ERROR, FlagCarrier
from ddp.strategies.base import DataParallelBase, PendingAllReduce, weak_method


class OverlapDDP(DataParallelBase):
    """Per-parameter async all-reduces launched by `register_post_accumulate_grad_hook`.

    Collectives pair up across ranks by issue order, so they go out in one fixed order (reverse
    registration, roughly the order backward produces gradients): a gradient that is ready before
    its predecessors waits for them. The smallest parameter goes last, issued at
    `finish_gradient_synchronization()` with the step's "had a gradient" flags appended
    (ddp.grads.grad_flags.FlagCarrier).
    """

    def __init__(self, module: nn.Module, collective: str = "torch"):
        super().__init__(module, collective)
        self.carrier = FlagCarrier(self.params) if self.params else None
        self.order = self.carrier.order if self.carrier else []
        self._ready = [False] * len(self.order)
        self._pending: list[PendingAllReduce] = []
        self._next = 0  # position in `order` of the next collective to issue
        ready = weak_method(self._on_gradient_ready)  # not `self`: the hooks would keep the wrapper alive
        for pos, i in enumerate(self.order):
            self.params[i].register_post_accumulate_grad_hook(lambda _p, pos=pos: ready(pos))

    def comm_buffers(self) -> list[torch.Tensor]:
        return [self.carrier.buffer] if self.carrier else []

    def comm_layout(self) -> list[dict]:
        return self.carrier.layout(self.param_names) if self.carrier else []

    def _on_gradient_ready(self, pos: int) -> None:
        if self._ready[pos]:
            raise RuntimeError(ACCUMULATION_ERROR)
        self._ready[pos] = True
        while self._next < len(self.order) - 1 and self._ready[self._next]:
            self._issue(self._next)

    def _issue(self, pos: int) -> None:
        i = self.order[pos]
        grad = self.carrier.flags.grad_or_zeros(i)  # type: ignore[union-attr]  # a hook implies a carrier
        self._pending.append(self.async_all_reduce(grad, self.param_names[i]))
        self._next = pos + 1

    @torch.no_grad()
    def _synchronize(self) -> None:
        carrier = self.carrier
        if carrier is None:  # no trainable parameter
            return
        flags = carrier.flags
        flags.write_present()  # before _issue gives a missing gradient zeros
        while self._next < len(self.order) - 1:  # parameters whose hook never fired this step
            self._issue(self._next)
        packed = self.async_all_reduce(carrier.pack(), self.param_names[carrier.index])
        for pending in self._pending:
            pending.wait().div_(self.world_size)
        packed.wait()
        carrier.unpack().div_(self.world_size)
        flags.drop_unused()
        for pos in range(len(self._ready)):
            self._ready[pos] = False
        self._pending.clear()
        self._next = 0
