"""One FSDP unit at run time (ddp.strategies.fsdp): its gather buffer, what is in flight for it, and the casts of
`compute_dtype`.

The gathered weights live in `full`; during forward the module's parameters are views of it made by `Unflatten`,
whose backward writes their gradients into one flat float32 buffer however often the unit runs, and the
post-accumulate hook of the empty leaf `sink` (an input of every `Unflatten` call) says when the unit's backward
is over. Between uses the storage of `full` is resized to 0 bytes (the saved views stay valid and see the data
again once it is regathered); the collectives write through `raw`, an alias without autograd's version
counter, so regathering is not an in-place change that autograd would refuse.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from contract import ALL_GATHER, REDUCE_SCATTER, comm_range, comm_wait_range
from ddp.comm.instrumented import InFlight
from ddp.grads.grad_flags import ACCUMULATION_ERROR
from ddp.sharding.gradient_buffers import GradientBuffers
from ddp.sharding.shard_units import ShardUnit


class Unflatten(torch.autograd.Function):
    """The gathered flat vector -> its parameters as views. Backward writes their gradients, in float32 whatever
    the compute dtype, into the unit's flat gradient buffer (`UnitState.flat`, taken from the shared
    GradientBuffers on the unit's first gradient of the step, zeros between and after the parameters) and adds
    those of later calls of the same unit to it. The leaf `sink` gets an empty gradient: it is there for its
    post-accumulate hook, which autograd runs once every call's backward has contributed."""

    @staticmethod
    def forward(ctx: Any, sink: torch.Tensor, full: torch.Tensor, state: UnitState) -> tuple[torch.Tensor, ...]:
        ctx.state = state
        ctx.set_materialize_grads(False)  # a parameter the unit did not use: nothing to allocate for it
        return tuple(state.unit.views(full))

    @staticmethod
    @torch.no_grad()
    def backward(ctx: Any, *grads: torch.Tensor | None) -> tuple[torch.Tensor, None, None]:
        state: UnitState = ctx.state
        if state.scattered:  # its gradient is already on the wire, from the buffer this would write into
            raise RuntimeError(ACCUMULATION_ERROR)
        flat, first = state.flat, state.flat is None
        if flat is None:
            flat = state.flat = state.buffers.take(state)[: state.unit.padded_numel]
            for start, stop in state.gaps:
                flat[start:stop].zero_()
        for view, g in zip(state.unit.views(flat), grads, strict=True):
            if g is not None and first:
                view.copy_(g)
            elif g is not None:
                view.add_(g)
            elif first:
                view.zero_()
        return state.no_grad, None, None


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

    def __init__(self, unit: ShardUnit, wire: torch.dtype, meter: GatheredMeter, buffers: GradientBuffers):
        self.unit, self.meter, self.buffers = unit, meter, buffers
        like = unit.shard
        self.full = torch.empty(unit.padded_numel, dtype=wire, device=like.device)
        self.raw = self.full.data  # same storage, no version counter shared with `full`
        self._bytes = self.full.untyped_storage().nbytes()
        self.full.untyped_storage().resize_(0)  # gathered on demand (`gather_buffers`)
        # Autograd's leaf for the unit, empty: its post-accumulate hook fires once the unit's backward is over.
        self.sink = torch.empty(0, dtype=like.dtype, device=like.device).requires_grad_()
        self.no_grad = torch.empty(0, dtype=like.dtype, device=like.device)  # the gradient Unflatten gives it
        self.flat: torch.Tensor | None = None  # this step's flat float32 gradient (a GradientBuffers buffer)
        self.gaps = unit.gaps()
        self.scattered = False  # its reduce-scatter was issued this step
        self.send = torch.empty(unit.shard_numel, dtype=wire, device=like.device) if wire != like.dtype else unit.shard
        self.gather: InFlight | None = None
        self.reduce: InFlight | None = None
        # its collectives' NVTX ranges, and those that mark where the rank waits for them (contract/names.py)
        self.gather_range, self.scatter_range = comm_range(ALL_GATHER, unit.name), comm_range(REDUCE_SCATTER, unit.name)
        self.gather_wait_range = comm_wait_range(ALL_GATHER, unit.name)
        self.scatter_wait_range = comm_wait_range(REDUCE_SCATTER, unit.name)
        self.gathered = False

    def gather_buffers(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(where the all-gather writes, what this rank sends): the storage regrown, the shard cast. Never while
        this unit's previous all-gather is pending: it may still read `send` (rule 3 of docs/fsdp.md's "Streams
        and buffer lifetimes")."""
        if self.gather is not None:
            raise RuntimeError(f"fsdp: unit {self.unit.name} regathered while its all-gather is pending")
        storage = self.full.untyped_storage()
        if storage.nbytes() != self._bytes:
            storage.resize_(self._bytes)
            self.meter.grow(self._bytes)
        if self.send is not self.unit.shard:
            self.send.copy_(self.unit.shard)
        return self.raw, self.send

    def free(self) -> None:
        """Give back the gathered weights' memory (the views saved for backward see them again on regather). Only
        once its all-gather was waited for on the current stream (rule 1 of docs/fsdp.md's "Streams and buffer
        lifetimes"): resizing the storage to 0 hands the block back to the caching allocator, whatever still
        refers to the tensor, and a collective still writing it would write into memory given out again."""
        if self.gather is not None:
            raise RuntimeError(f"fsdp: unit {self.unit.name}'s gathered weights freed while its all-gather is pending")
        storage = self.full.untyped_storage()
        if storage.nbytes():
            self.meter.live -= storage.nbytes()
            storage.resize_(0)
        self.gathered = False

    def show_gathered(self, grad_enabled: bool) -> None:
        """Point the module's parameter attributes at views of the gathered weights."""
        views = Unflatten.apply(self.sink, self.full, self) if grad_enabled else self.unit.views(self.full)
        for p, view in zip(self.unit.params, views, strict=True):
            self.unit.show(p, view)

    def show_pieces(self) -> None:
        """Point them back at this rank's shard pieces (what the optimizer and `.module` see)."""
        for p in self.unit.params:
            assert p.piece is not None
            self.unit.show(p, p.piece)

    def let_go_of_gradient(self) -> None:
        """Its reduce-scatter completed: the flat gradient's buffer may serve another unit."""
        if self.flat is not None:
            self.buffers.give_back(self)
            self.flat = None

    def take_mean_gradient(self, world_size: int) -> None:
        """After the reduce-scatter: the shard's float32 gradient is the mean; the pieces point at it."""
        self.unit.grad.div_(world_size)
        self.sink.grad = None
        self.scattered = False
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


class WeightCast:
    """A parameter's copy in the compute dtype, kept from call to call: `out` is what forward computes with (as
    views), `raw` the alias it is written through, without autograd's version counter (a second call in the
    same step rewrites the same values under views saved by the first)."""

    def __init__(self, p: torch.Tensor, dtype: torch.dtype):
        self.out = torch.empty_like(p, dtype=dtype)
        self.raw = self.out.data


class CastCopy(torch.autograd.Function):
    """`p` cast into its WeightCast, differentiable: backward hands the gradient back in the compute dtype and
    autograd casts it to `p`'s float32, as it does for `p.to(dtype)`."""

    @staticmethod
    def forward(ctx: Any, p: torch.Tensor, cast: WeightCast) -> torch.Tensor:
        cast.raw.copy_(p)
        return cast.out.view_as(cast.out)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


def cast_hooks(
    module: nn.Module,
    dtype: torch.dtype,
    skip: frozenset[int] = frozenset(),
    casts: dict[int, WeightCast] | None = None,
) -> list[Any]:
    """Run every submodule that holds parameters in `dtype`: each call casts its floating inputs and reads its
    own parameters (but those whose id is in `skip`) as casts written for that call into buffers kept in
    `casts` (by parameter id, one per parameter however many modules hold it), differentiable, so gradients
    reach the float32 parameters, one contribution per call. The hooks' handles."""
    casts = {} if casts is None else casts
    handles = []
    for sub in dict.fromkeys(module.modules()):
        own = [(attr, p) for attr, p in sub._parameters.items() if p is not None and id(p) not in skip]
        if not sub._parameters:
            continue
        for _, p in own:
            if p.dtype != dtype and id(p) not in casts:
                casts[id(p)] = WeightCast(p, dtype)

        def pre(_m: nn.Module, args: tuple, kwargs: dict, own: list = own, sub: nn.Module = sub) -> tuple[tuple, dict]:
            for attr, p in own:
                sub._parameters[attr] = CastCopy.apply(p, casts[id(p)]) if id(p) in casts else p
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
