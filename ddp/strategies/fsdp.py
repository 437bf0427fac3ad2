"""FSDP (registry name `fsdp`): fully sharded data parallelism (ZeRO-3), written with plain collectives.

Every module matched by `shard` is a *unit* (ddp.sharding.shard_units): each rank stores 1/W of its trainable
parameters (float32, padded) and the optimizer steps only that slice. Forward all-gathers a unit's weights
(cast to `compute_dtype` first) right before it runs, `prefetch` units ahead, and frees them after; backward
gathers them again in reverse order, and reduce-scatters each unit's gradient as soon as autograd has
accumulated it, so that each rank's shard receives the mean gradient. Parameters outside units (norms, weights
tied across modules) stay replicated and are all-reduced as their gradients arrive, as in `overlap`.

Every rank must run the same units in the same order, and give every replicated parameter a gradient or none on all
ranks alike (as PyTorch's FSDP requires): the collectives pair up by issue order, so a unit or parameter used on
some ranks only stalls the step until the process-group timeout (the launcher then names the collective). After the
first step, a step allocates nothing of its own but the gather buffers (each all-gather regrows its unit's, each
free gives it back): gradients go through flat buffers the units share (ddp.sharding.gradient_buffers) into the
shards' own; casts are written into buffers kept from step to step. A unit's collectives are
`comm:all_gather:<unit>` and `comm:reduce_scatter:<unit>` start/end ranges whose payload is the padded unit in the
dtype on the wire (nccl-tests' convention, contract/names.py): weights travel in `compute_dtype`, gradients in
float32 (reduced without rounding to the compute dtype).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from contract import REDUCE_SCATTER, REDUCE_SCATTER_GROUP, comm_range, sharded_entry
from ddp.comm import nvtx_ranges
from ddp.comm.completion_poll import CompletionPoll
from ddp.grads.grad_flags import ACCUMULATION_ERROR
from ddp.memory.accounting import storage_key
from ddp.sharding.gradient_buffers import GradientBuffers
from ddp.sharding.shard_units import ShardSpec, find_units
from ddp.sharding.unit_state import GatheredMeter, UnitState, WeightCast, cast_floating, cast_hooks
from ddp.strategies.base import DataParallelBase, PendingAllReduce, nbytes, weak_method

COMPUTE_DTYPES = (None, torch.float32, torch.float16, torch.bfloat16)
DEFAULT_PREFETCH = 2
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


class FSDP(DataParallelBase):
    """Fully sharded data parallelism; see the module docstring. `prefetch` >= 1: a unit's all-gather starts
    once the unit `prefetch` places before it (in forward; after it, in backward) has finished, so 1 gathers
    on demand and 2 (the default) keeps one gather in flight under the previous unit's compute.
    `separate_reduce_scatter`: reduce-scatters on a process group of their own (`rs_group`)."""

    def __init__(
        self,
        module: nn.Module,
        compute_dtype: torch.dtype | None = None,
        *,
        shard: ShardSpec = (nn.Linear, nn.Embedding),
        prefetch: int = DEFAULT_PREFETCH,
        collective: str = "torch",
        separate_reduce_scatter: bool = False,
    ):
        if compute_dtype not in COMPUTE_DTYPES:
            raise ValueError(f"compute_dtype must be None, torch.float16 or torch.bfloat16, got {compute_dtype!r}")
        if not isinstance(prefetch, int) or isinstance(prefetch, bool) or prefetch < 1:
            raise ValueError(f"prefetch must be an integer >= 1, got {prefetch!r}")
        if not (isinstance(shard, tuple) or callable(shard)):
            raise ValueError(f"shard must be a tuple of module types or a predicate, got {shard!r}")
        if not isinstance(separate_reduce_scatter, bool):
            raise ValueError(f"separate_reduce_scatter must be True or False, got {separate_reduce_scatter!r}")
        super().__init__(module, collective)
        self.compute_dtype, self.prefetch = compute_dtype, prefetch
        # Same ranks and backend: on NCCL its own communicator and stream (created once, by every rank alike).
        self.separate_reduce_scatter = separate_reduce_scatter
        self.rs_group = dist.new_group(list(range(self.world_size))) if separate_reduce_scatter else None
        self.rank = dist.get_rank()
        # The ranks a unit is sharded over (hsdp: its shard group), how many, and this rank's place among them.
        self.shard_group, self.shard_world, self.shard_rank = self._shard_layout()
        units = find_units(module, shard, self.shard_world, self.shard_rank)
        sharded = {id(p.original) for u in units for p in u.params}
        for unit in units:
            unit.split()
        # The base listed every trainable parameter; from here on only the replicated ones are all-reduced.
        named = [(n, p) for n, p in zip(self.param_names, self.params, strict=True) if id(p) not in sharded]
        self.param_names, self.params = [n for n, _ in named], [p for _, p in named]
        wire = compute_dtype or torch.float32
        self._meter = GatheredMeter()
        largest, like = max((u.padded_numel for u in units), default=0), units[0].shard if units else torch.empty(0)
        self._grad_buffers = GradientBuffers(largest, like.dtype, like.device, self._reclaim_gradient_buffer)
        self.states = [UnitState(u, wire, self._meter, self._grad_buffers) for u in units]
        if separate_reduce_scatter:  # their ranges name the group (contract/groups.py), as ddp.meta lists it
            for state in self.states:
                state.scatter_range = comm_range(REDUCE_SCATTER, state.unit.name, REDUCE_SCATTER_GROUP)
        self._order: list[UnitState] = []  # forward order of first calls, recorded in the first step
        self._recorded = False
        self._pending_ar: list[PendingAllReduce] = []
        self._rs_issued: list[UnitState] = []
        self._poll = self.collectives.poll = CompletionPoll()  # collectives without a future (gloo's reduce-scatter)
        # Gradient hooks hold the wrapper weakly and a unit by its index (ddp.strategies.base.weak_method).
        post_backward, on_replicated_grad = weak_method(self._post_backward), weak_method(self._on_replicated_grad)
        for k, state in enumerate(self.states):
            state.unit.module.register_forward_pre_hook(self._pre_forward(state), with_kwargs=True)
            state.unit.module.register_forward_hook(self._post_forward(state))
            state.sink.register_post_accumulate_grad_hook(lambda _t, k=k: post_backward(k))
        self._casts: dict[int, WeightCast] = {}  # the other parameters' copies in compute_dtype
        if compute_dtype is not None:  # registered after the units' hooks: runs on what they put in place
            pieces = frozenset(id(p.piece) for u in units for p in u.params)
            cast_hooks(module, compute_dtype, skip=pieces, casts=self._casts)
        for name, p in named:
            p.register_post_accumulate_grad_hook(lambda p, name=name: on_replicated_grad(p, name))

    # ---- forward --------------------------------------------------------------------------
    def forward(self, *args, **kwargs):
        if self.compute_dtype is not None:
            args, kwargs = cast_floating((args, kwargs), self.compute_dtype)
        for state in self._order[: self.prefetch]:
            self._issue_gather(state)
        out = self.module(*args, **kwargs)
        if self._order and torch.is_grad_enabled():
            for t in _tensors(out):
                if t.requires_grad:
                    t.register_hook(self._backward_started)
        self._recorded = self._recorded or bool(self._order)
        return out

    def _pre_forward(self, state: UnitState) -> Callable[[nn.Module, tuple, dict], None]:
        def hook(_module: nn.Module, args: tuple, kwargs: dict) -> None:
            if not self._recorded and state not in self._order:
                self._order.append(state)
            self._issue_gather(state)
            self._wait_gather(state)
            state.show_gathered(torch.is_grad_enabled())

        return hook

    def _post_forward(self, state: UnitState) -> Callable[[nn.Module, tuple, Any], None]:
        def hook(_module: nn.Module, _args: tuple, out: Any) -> None:
            state.show_pieces()
            state.free()
            if torch.is_grad_enabled():
                for t in _tensors(out):
                    if t.requires_grad:
                        t.register_hook(lambda _g, s=state: self._pre_backward(s))
            if self._recorded and state in self._order:
                self._prefetch(self._order, self._order.index(state))

        return hook

    # ---- backward -------------------------------------------------------------------------
    def _backward_started(self, _grad: torch.Tensor) -> None:
        for state in self._order[::-1][: self.prefetch]:
            self._issue_gather(state)

    def _pre_backward(self, state: UnitState) -> None:
        self._poll.poll()
        self._drop_reduced_inputs()
        self._issue_gather(state)
        self._wait_gather(state)

    def _post_backward(self, k: int) -> None:
        state = self.states[k]
        if state.scattered:
            raise RuntimeError(ACCUMULATION_ERROR)
        self._poll.poll()
        self._drop_reduced_inputs()
        state.free()
        grad, group = state.flat, self.shard_group if self.rs_group is None else self.rs_group
        assert grad is not None
        state.reduce = self.collectives.start(
            state.scatter_range,
            nbytes(grad),
            lambda: _reduce_scatter(state.unit.grad, grad, group=group, async_op=True),
        )
        state.scattered = True
        self._rs_issued.append(state)
        if self._recorded and state in self._order:
            backward_order = self._order[::-1]
            self._prefetch(backward_order, backward_order.index(state))

    def _drop_reduced_inputs(self) -> None:
        """Give back the flat gradient buffers whose reduce-scatter completed, each once its work was waited for on
        the current stream (docs/fsdp.md, "Streams and buffer lifetimes", rule 2: is_completed() is the host's view)."""
        for state in self._rs_issued:
            if state.flat is not None and state.reduce is not None and state.reduce.is_completed():
                self._finish_reduce(state)

    def _reclaim_gradient_buffer(self) -> bool:
        """Wait for the oldest reduce-scatter whose input buffer is still held, and give that buffer back."""
        for state in self._rs_issued:
            if state.flat is not None:
                # marked: in the middle of backward, the time this rank blocks here is not compute
                with nvtx_ranges.range(state.scatter_wait_range):
                    self._finish_reduce(state)
                return True
        return False

    def _finish_reduce(self, state: UnitState) -> None:
        if state.reduce is not None:
            state.reduce.wait()
            state.reduce = None
        state.let_go_of_gradient()

    def _on_replicated_grad(self, p: torch.Tensor, name: str) -> None:
        if any(pending.tensor is p.grad for pending in self._pending_ar):
            raise RuntimeError(ACCUMULATION_ERROR)
        self._pending_ar.append(self.async_all_reduce(p.grad, name))  # type: ignore[arg-type]

    @torch.no_grad()
    def _synchronize(self) -> None:
        for state in self._rs_issued:
            self._finish_reduce(state)
        self._reduce_across_replicas()
        for state in self._rs_issued:
            state.take_mean_gradient(self.world_size)
        for pending in self._pending_ar:
            pending.wait().div_(self.world_size)
        for state in self.states:
            self._wait_gather(state)  # a gather prefetched for a unit whose backward never ran: wait before freeing
            state.free()
        self._rs_issued.clear()
        self._pending_ar.clear()

    # ---- what hsdp changes -----------------------------------------------------------------
    def _shard_layout(self) -> tuple[dist.ProcessGroup | None, int, int]:
        """The group each unit is sharded over, its size and this rank's index in it: every rank."""
        return self.group, self.world_size, self.rank

    def _reduce_across_replicas(self) -> None:
        """After the reduce-scatters: nothing (every rank holds a different shard)."""

    # ---- gathers --------------------------------------------------------------------------
    def _prefetch(self, order: list[UnitState], position: int) -> None:
        if position + self.prefetch < len(order):
            self._issue_gather(order[position + self.prefetch])

    def _issue_gather(self, state: UnitState) -> None:
        if state.gathered or state.gather is not None:
            return
        out, send = state.gather_buffers()
        state.gather = self.collectives.start(
            state.gather_range, nbytes(out), lambda: _all_gather(out, send, group=self.shard_group, async_op=True)
        )

    def _wait_gather(self, state: UnitState) -> None:
        if state.gather is not None:
            # marked: the time this rank blocks here is not compute, though it lies inside forward/backward
            with nvtx_ranges.range(state.gather_wait_range):
                state.gather.wait()
            state.gather, state.gathered = None, True

    # ---- what the rest of the project reads -----------------------------------------------
    def comm_layout(self) -> list[dict]:
        """The replicated parameters' all-reduces (one per parameter, tagged with its name)."""
        return [
            {"name": n, "params": [n], "bytes": nbytes(p)} for n, p in zip(self.param_names, self.params, strict=True)
        ]

    def sharded_layout(self) -> list[dict]:
        """One `contract.sharded_entry` per unit, in forward order (registration order before the first step);
        gradients are reduce-scattered in float32 whatever the compute dtype."""
        itemsize = torch.empty((), dtype=self.compute_dtype or torch.float32).element_size()
        entries = []
        for s in self._order or self.states:
            unit = s.unit
            entry = sharded_entry(
                unit.name, [p.name for p in unit.params], unit.numel, unit.padded_numel, itemsize,
                unit.shard.element_size(), self.shard_world,
            )  # fmt: skip
            entry["reduce_scatter_bytes"] = unit.padded_numel * unit.grad.element_size()
            entries.append(entry)
        return entries

    # ---- memory (ddp.memory.accounting's contract; parameters and gradients as the base counts them) ----
    def gathered_bytes(self) -> int:
        """The most bytes of gathered weights (in the dtype on the wire) alive at once in any step so far."""
        return self._meter.peak

    def comm_buffers(self) -> list[torch.Tensor]:
        """The flat float32 gradient buffers (ddp.sharding.gradient_buffers); with a `compute_dtype`, the shards
        cast for sending and the other parameters' copies forward computes with (none in fp32)."""
        sends = [s.send for s in self.states if s.send is not s.unit.shard]
        return [*self._grad_buffers.buffers, *sends, *(c.out for c in self._casts.values())]

    def holds_weights(self, tensor: torch.Tensor) -> bool:
        """Saved for backward inside a unit's gathered weights (counted in `gathered`) or a parameter's copy in
        `compute_dtype` (in `comm_buffers`), or the base's rule."""
        key = storage_key(tensor)
        mine = [s.full for s in self.states] + [c.out for c in self._casts.values()]
        return any(key == storage_key(t) for t in mine) or super().holds_weights(tensor)

    @torch.no_grad()
    def gather_full_params(self) -> dict[str, torch.Tensor]:
        """Every parameter in full, float32, under its name in `.module` (collective: every rank calls it)."""
        full: dict[str, torch.Tensor] = {}
        for state in self.states:
            buffer = state.unit.shard.new_empty(state.unit.padded_numel)
            _all_gather(buffer, state.unit.shard, group=self.shard_group)
            full.update(state.unit.full_params(buffer))
        return {n: full[n] if n in full else p.detach().clone() for n, p in self.module.named_parameters()}


def _tensors(out: Any) -> Iterable[torch.Tensor]:
    """The tensors of a module's output (a tensor, or a tuple/list/dict holding some)."""
    if isinstance(out, torch.Tensor):
        yield out
    elif isinstance(out, (tuple, list)):
        for item in out:
            yield from _tensors(item)
    elif isinstance(out, dict):
        for item in out.values():
            yield from _tensors(item)
