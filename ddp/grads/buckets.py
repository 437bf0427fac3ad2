"""Gradient buckets: the life of one bucket per step (which parameters share one: contract.buckets.plan_buckets)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch

from contract import ALL_REDUCE, comm_issue_range
from ddp.comm import nvtx_ranges
from ddp.comm.instrumented import nbytes
from ddp.grads.grad_flags import GradFlags


class Pending(Protocol):
    """An async all-reduce in flight (the wrapper's `async_all_reduce` returns one)."""

    def wait(self) -> Any: ...


class Bucket:
    """Parameters whose gradients live in one buffer: [grads..., one "had a gradient" flag each].

    Each parameter's `.grad` becomes a view into the buffer (like DDP's `gradient_as_bucket_view`):
    the all-reduce works in place on divided gradients, with no copy back. When
    gradients are kept between steps (`zero_grad(set_to_none=False)`) backward accumulates straight
    into the buffer and nothing is copied; after `set_to_none=True` autograd hands a new tensor,
    which is copied in once and replaced by the view. Every list and view is built here, once: a
    step allocates no tensors and moves nothing between host and device (flags are written by
    scalar fills, and read back only when some parameter had no local gradient).
    """

    def __init__(self, index: int, params: list[torch.nn.Parameter], names: list[str]):
        self.index, self.params, self.names = index, params, names
        self.sizes = [p.numel() for p in params]
        self.num_grad = sum(self.sizes)
        offsets = [sum(self.sizes[:k]) for k in range(len(self.sizes))]
        self.buffer, self.flags = GradFlags.appended(self.num_grad, params, like=params[0])
        self.grads = self.buffer[: self.num_grad]
        self.views = [
            self.buffer[start : start + size].view_as(p)
            for start, size, p in zip(offsets, self.sizes, params, strict=True)
        ]
        self.tag = f"bucket{index}"
        self.issue_range = comm_issue_range(ALL_REDUCE, self.tag)
        self.ready = [False] * len(params)
        self.num_ready = 0
        self.pending: Pending | None = None

    @property
    def is_full(self) -> bool:
        return self.num_ready == len(self.params)

    def layout(self) -> dict:
        """What ddp.meta records: the tag of its `comm:all_reduce` range, parameter names, payload bytes."""
        return {"name": self.tag, "params": list(self.names), "bytes": nbytes(self.buffer)}

    def _adopt(self, slot: int) -> None:
        """Make parameter `slot`'s .grad the bucket's view, copying a gradient held elsewhere in."""
        p, view = self.params[slot], self.views[slot]
        if p.grad is not view:
            assert p.grad is not None, "only a parameter that holds a gradient is adopted"
            view.copy_(p.grad)
            p.grad = view

    def adopt_gradients(self) -> None:
        """After a rebuild: bring every existing gradient into this bucket's buffer."""
        with torch.no_grad():
            for slot, p in enumerate(self.params):
                if p.grad is not None:
                    self._adopt(slot)

    def mark_ready(self, slot: int) -> bool:
        """Parameter `slot`'s gradient is in (hook); return True once every slot is in."""
        self._adopt(slot)
        self.ready[slot] = True
        self.flags.mark(slot)
        self.num_ready += 1
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
                self.views[slot].zero_()
                p.grad = self.views[slot]
            else:
                self._adopt(slot)
                self.flags.mark(slot)

    def launch(self, world_size: int, all_reduce: Callable[[torch.Tensor, str], Pending]) -> None:
        """Divide the gradients by the world size in place (as DDP does: the sum is then the mean,
        with nothing left to do after the wait), write the flags, start the async all-reduce; inside a
        `comm_issue` push/pop range (the host's time per bucket besides the transfer)."""
        with nvtx_ranges.range(self.issue_range):
            self.grads.div_(world_size)
            self.flags.write()
            self.pending = all_reduce(self.buffer, self.tag)

    def wait(self) -> None:
        """Wait for the all-reduce: each .grad view now holds the mean over ranks."""
        if self.pending is None:
            raise RuntimeError(f"bucket {self.tag} waited for before it was launched")
        self.pending.wait()
        self.flags.drop_unused()

    def reset(self) -> None:
        """Ready for the next step: no slot in, no flag set, nothing in flight."""
        for slot in range(len(self.params)):
            self.ready[slot] = False
        self.flags.clear()
        self.num_ready = 0
        self.pending = None
