"""FlatDDP: after backward, every gradient copied into one flat buffer and one blocking all-reduce."""

from __future__ import annotations

import torch
from torch import nn

from ddp.grads.grad_flags import GradFlags
from ddp.strategies.base import DataParallelBase, check_same_dtype_and_device, nbytes


class FlatDDP(DataParallelBase):
    """One blocking all-reduce of [all gradients, "had a gradient" flags] per step.

    The buffer is allocated once; each step copies the gradients in and the means back out.
    """

    def __init__(self, module: nn.Module, collective: str = "torch"):
        super().__init__(module, collective)
        check_same_dtype_and_device(self.params, type(self).__name__)
        if self.params:
            n_grad = sum(p.numel() for p in self.params)
            self._flat, self.flags = GradFlags.appended(n_grad, self.params, like=self.params[0])
            self._grads = self._flat[:n_grad]
            self._chunks = [
                c.view_as(p)
                for c, p in zip(self._grads.split([p.numel() for p in self.params]), self.params, strict=True)
            ]

    def comm_buffers(self) -> list[torch.Tensor]:
        return [self._flat] if self.params else []

    def comm_layout(self) -> list[dict]:
        return [{"name": "flat", "params": list(self.param_names), "bytes": nbytes(self._flat)}] if self.params else []

    @torch.no_grad()
    def _synchronize(self) -> None:
        if not self.params:
            return
        self.flags.write_present()
        torch.cat([self.flags.grad_or_zeros(k).reshape(-1) for k in range(len(self.params))], out=self._grads)
        self.blocking_all_reduce(self._flat, "flat")
        for p, chunk in zip(self.params, self._chunks, strict=True):
            torch.div(chunk, self.world_size, out=p.grad)  # average while copying out
        self.flags.drop_unused()
