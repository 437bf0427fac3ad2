"""One FSDP unit at run time (ddp.strategies.fsdp): its gather buffer, what is in flight for it, and the casts of
`compute_dtype`.

The gathered weights live in `full`, a leaf tensor that requires grad: the module's parameters are views
of it during forward, so autograd accumulates one flat float32 gradient in `sink.grad` however often the unit runs, and
the post-accumulate hook of `sink` says when the unit's backward is over. Between uses its storage is resized to
0 bytes (the saved views stay valid and see the data again once it is regathered); the collectives write
through `raw`, an alias without autograd's version counter, so regathering is not an in-place change that
autograd would refuse.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ddp.strategies.shard_units import ShardUnit


@dataclass
class Pending:
    """An async collective: its CommTimer slot and handle."""

    slot: int
    work: Any


class Unflatten(torch.autograd.Function):
    """The gathered flat vector -> its parameters as views; backward assembles one float32 flat gradient
    (zeros in the padding): gradients are reduced in float32 whatever the compute dtype."""

    @staticmethod
    def forward(ctx: Any, sink: torch.Tensor, full: torch.Tensor, unit: ShardUnit) -> tuple[torch.Tensor, ...]:
        ctx.unit = unit
        return tuple(unit.views(full))

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        unit: ShardUnit = ctx.unit
        flat = grads[0].new_zeros(unit.padded_numel, dtype=unit.shard.dtype)
        for p, g in zip(unit.params, grads, strict=True):
            flat[p.offset : p.offset + p.numel].copy_(g.reshape(-1))
        return flat, None, None


@dataclass
class GatheredMeter:
    """Bytes of gathered weights alive now, and the most alive at once so far (FSDP's `gathered` memory)."""

    live: int = 0
    peak: int = 0

    def grow(self, size: int) -> None:
        self.live += size
        self.peak = max(self.peak, self.live)


class UnitState:
    """A unit's buffers (allocated once) and its collectives of the current step."""

    def __init__(self, unit: ShardUnit, wire: torch.dtype, meter: GatheredMeter):
        self.unit, self.meter = unit, meter
        like = unit.shard
        self.full = torch.empty(unit.padded_numel, dtype=wire, device=like.device)
        self.raw = self.full.data  # same storage, no version counter shared with `full`
        self._bytes = self.full.untyped_storage().nbytes()
        self.full.untyped_storage().resize_(0)  # gathered on demand (`gather_buffers`)
        # Autograd's leaf for the unit: float32, the gathered shape, no memory of its own; its .grad is the
        # unit's flat gradient and its post-accumulate hook fires once the unit's backward is over.
        self.sink = torch.empty(unit.padded_numel, dtype=like.dtype, device=like.device).requires_grad_()
        self.sink.untyped_storage().resize_(0)
        self.send = torch.empty(unit.shard_numel, dtype=wire, device=like.device) if wire != like.dtype else unit.shard
        self.gather: Pending | None = None
        self.reduce: Pending | None = None
        self.gathered = False

    def gather_buffers(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(where the all-gather writes, what this rank sends): the storage regrown, the shard cast."""
        storage = self.full.untyped_storage()
        if storage.nbytes() != self._bytes:
            storage.resize_(self._bytes)
            self.meter.grow(self._bytes)
        if self.send is not self.unit.shard:
            self.send.copy_(self.unit.shard)
        return self.raw, self.send

    def free(self) -> None:
        """Give back the gathered weights' memory (the views saved for backward see them again on regather)."""
        assert getattr(self, "gather", None) is None, ("free while pending", self.unit.name)
        storage = self.full.untyped_storage()
        if storage.nbytes():
            self.meter.live -= storage.nbytes()
            storage.resize_(0)
        self.gathered = False

    def show_gathered(self, grad_enabled: bool) -> None:
        """Point the module's parameter attributes at views of the gathered weights."""
        views = Unflatten.apply(self.sink, self.full, self.unit) if grad_enabled else self.unit.views(self.full)
        for p, view in zip(self.unit.params, views, strict=True):
            self.unit.show(p, view)

    def show_pieces(self) -> None:
        """Point them back at this rank's shard pieces (what the optimizer and `.module` see)."""
        for p in self.unit.params:
            assert p.piece is not None
            self.unit.show(p, p.piece)

    def take_mean_gradient(self, world_size: int) -> None:
        """After the reduce-scatter: the shard's float32 gradient is the mean; the pieces point at it."""
        self.unit.grad.div_(world_size)
        self.sink.grad = None
        self.unit.give_grads()


def cast_floating(tree: Any, dtype: torch.dtype) -> Any:
    """`tree` (tensors in tuples, lists, dicts) with every floating-point tensor cast to `dtype`."""
    if isinstance(tree, torch.Tensor):
        return tree.to(dtype) if tree.is_floating_point() else tree
    if isinstance(tree, tuple):
        return tuple(cast_floating(t, dtype) for t in tree)
    if isinstance(tree, list):
        return [cast_floating(t, dtype) for t in tree]
    if isinstance(tree, dict):
        return {k: cast_floating(v, dtype) for k, v in tree.items()}
    return tree


def cast_hooks(module: nn.Module, dtype: torch.dtype, skip: frozenset[int] = frozenset()) -> list[Any]:
    """Run every submodule that holds parameters in `dtype`: each call casts its floating inputs and reads its
    own parameters (but those whose id is in `skip`) as casts made for that call, differentiable, so gradients
    reach the float32 parameters, one contribution per call. The hooks' handles."""
    handles = []
    for sub in dict.fromkeys(module.modules()):
        own = [(attr, p) for attr, p in sub._parameters.items() if p is not None and id(p) not in skip]
        if not sub._parameters:
            continue

        def pre(_m: nn.Module, args: tuple, kwargs: dict, own: list = own, sub: nn.Module = sub) -> tuple[tuple, dict]:
            for attr, p in own:
                sub._parameters[attr] = p.to(dtype)
            return cast_floating((args, kwargs), dtype)

        def post(_m: nn.Module, _args: tuple, _out: Any, own: list = own, sub: nn.Module = sub) -> None:
            for attr, p in own:
                sub._parameters[attr] = p

        handles.append(sub.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(sub.register_forward_hook(post))
    return handles


@contextlib.contextmanager
def casting(module: nn.Module, dtype: torch.dtype | None) -> Iterator[None]:
    """`cast_hooks` while open (nothing when `dtype` is None): single-process training that casts as FSDP does."""
    handles = cast_hooks(module, dtype) if dtype is not None else []
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
