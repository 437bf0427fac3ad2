"""Gradient buckets: which parameters share a flat buffer, and the life of one bucket per step."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ddp.base import DataParallelBase, PendingAllReduce


def plan_buckets(sizes_bytes: list[int], cap_bytes: float | None,
                 first_cap_bytes: float | None = None) -> list[list[int]]:
    """Group item indices, in the given order, into runs of at most `cap_bytes` (None: one run).

    An item larger than the cap gets a bucket of its own. `first_cap_bytes`, if given, caps the
    first bucket instead, so that communication can start early in backward.
    """
    if cap_bytes is None:
        return [list(range(len(sizes_bytes)))] if sizes_bytes else []
    plan: list[list[int]] = []
    current: list[int] = []
    filled = 0
    for i, size in enumerate(sizes_bytes):
        cap = first_cap_bytes if not plan and first_cap_bytes is not None else cap_bytes
        if current and filled + size > cap:
            plan.append(current)
            current, filled = [], 0
        current.append(i)
        filled += size
    if current:
        plan.append(current)
    return plan


@dataclass
class Bucket:
    """Parameters whose gradients travel in one buffer: [grads..., one "had a gradient" flag each]."""
    index: int
    params: list[torch.nn.Parameter]
    names: list[str]
    buffer: torch.Tensor = field(init=False)
    ready: list[bool] = field(init=False)
    had: list[bool] = field(init=False)  # per slot: a local gradient this step (its flag)
    pending: PendingAllReduce | None = field(init=False, default=None)

    def __post_init__(self):
        self.sizes = [p.numel() for p in self.params]
        self.num_grad = sum(self.sizes)
        self.offsets = [sum(self.sizes[:k]) for k in range(len(self.sizes))]
        ref = self.params[0]
        self.buffer = torch.zeros(self.num_grad + len(self.params), dtype=ref.dtype, device=ref.device)
        self.views = [self.buffer[start:start + size].view_as(p)  # built once: hooks run every step
                      for start, size, p in zip(self.offsets, self.sizes, self.params)]
        self.flags = self.buffer[self.num_grad:]
        self.reset()

    @property
    def tag(self) -> str:
        return f"bucket{self.index}"

    @property
    def is_full(self) -> bool:
        return all(self.ready)

    def mark_ready(self, slot: int) -> bool:
        """Copy parameter `slot`'s gradient in; return True once every slot is in."""
        self.views[slot].copy_(self.params[slot].grad)
        self.ready[slot] = self.had[slot] = True
        return self.is_full

    def fill_missing(self) -> None:
        """Fill the slots whose hook did not fire this step.

        A parameter that still holds a gradient (zeros kept by `zero_grad(set_to_none=False)`, or one
        written outside autograd) sends it as it is; one without a gradient sends zeros with flag 0.
        """
        for slot, p in enumerate(self.params):
            if self.ready[slot]:
                continue
            if p.grad is None:
                p.grad = torch.zeros_like(p)
                self.views[slot].zero_()
            else:
                self.views[slot].copy_(p.grad)
                self.had[slot] = True

    def launch(self, owner: DataParallelBase) -> None:
        """Write the "had a gradient" flags, then start the async all-reduce of the buffer."""
        if all(self.had):
            self.flags.fill_(1.0)
        else:
            self.flags.copy_(torch.tensor([1.0 if h else 0.0 for h in self.had], dtype=self.flags.dtype))
        self.pending = owner._async_all_reduce(self.buffer, self.tag)

    def wait(self, world_size: int) -> None:
        """Wait for the all-reduce, then write the mean back into each parameter's .grad."""
        self.pending.wait()
        for view, p in zip(self.views, self.params):  # divide while copying out: one pass over the data
            torch.div(view, world_size, out=p.grad)
        DataParallelBase._drop_unused(self.params, self.had, self.flags)

    def reset(self) -> None:
        self.ready = [False] * len(self.params)
        self.had = [False] * len(self.params)
        self.pending = None
