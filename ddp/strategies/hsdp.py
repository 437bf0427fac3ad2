"""HSDP (registry name `hsdp`): hybrid sharded data parallelism, `fsdp` on a 2-D layout of the ranks.

The W ranks form R replicas of S ranks each (`shard_size` S, contract.hsdp_layout: rank = replica * S + index,
torch's DeviceMesh order). Within a replica, the *shard group*, everything is `fsdp`: each rank stores 1/S of
every unit, all-gathers it before forward and backward and reduce-scatters its gradient. The ranks holding the
same shard, one per replica, form a *replicate group*: as soon as a unit's reduce-scatter has completed, its
gradient shard is all-reduced across them, so that after the step each shard holds the mean over all W ranks.
Parameters outside units (norms, tied weights) are summed the same way, within the shard group and then
across replicas, so that every gradient element is the same sum (((g0 + g1) + (g2 + g3)) on 2 x 2) whatever
order a backend adds in.

Ranges name their group (contract/groups.py): `comm:all_gather:<unit>@shard`, `comm:reduce_scatter:<unit>@shard`,
`comm:all_reduce:<unit>@replicate`, and for a replicated parameter `comm:all_reduce:<name>@shard` then
`...@replicate`. With S = W (one replica) this is `fsdp` on a named group, with nothing to all-reduce across.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from contract import (
    ALL_GATHER,
    ALL_REDUCE,
    REDUCE_SCATTER,
    REPLICATE_GROUP,
    SHARD_GROUP,
    comm_range,
    default_shard_size,
    hsdp_layout,
)
from ddp.grads.grad_flags import ACCUMULATION_ERROR
from ddp.sharding.shard_units import ShardSpec
from ddp.sharding.unit_state import UnitState
from ddp.strategies.base import PendingAllReduce, nbytes
from ddp.strategies.fsdp import DEFAULT_PREFETCH, FSDP


class HSDP(FSDP):
    """`fsdp` within shard groups of `shard_size` ranks (None: contract.default_shard_size), gradient shards
    all-reduced across replicas; see the module docstring. Every rank must construct it alike (it creates the
    process groups)."""

    def __init__(
        self,
        module: nn.Module,
        compute_dtype: torch.dtype | None = None,
        *,
        shard_size: int | None = None,
        shard: ShardSpec = (nn.Linear, nn.Embedding),
        prefetch: int = DEFAULT_PREFETCH,
        collective: str = "torch",
    ):
        world = dist.get_world_size()
        shard_size = default_shard_size(world) if shard_size is None else shard_size
        shards, replicas = hsdp_layout(world, shard_size)
        self._shard_size = shard_size
        # new_subgroups_by_enumeration: every rank creates every group, in the same order, and keeps its own
        self._shard_pg, _ = dist.new_subgroups_by_enumeration(shards)
        self.replicate_group, _ = dist.new_subgroups_by_enumeration(replicas)
        self.replicas = len(shards)
        self._names: dict[tuple[str, str], str] = {}
        self._replica_sums: dict[int, PendingAllReduce] = {}  # id(UnitState) -> its shard's all-reduce in flight
        self._replicated_tags: list[str] = []  # the tags of `_pending_ar`, in order
        super().__init__(module, compute_dtype, shard=shard, prefetch=prefetch, collective=collective)
        for state in self.states:
            state.gather_range = comm_range(ALL_GATHER, state.unit.name, SHARD_GROUP)
            state.scatter_range = comm_range(REDUCE_SCATTER, state.unit.name, SHARD_GROUP)

    def _shard_layout(self) -> tuple[dist.ProcessGroup | None, int, int]:
        return self._shard_pg, self._shard_size, dist.get_rank() % self._shard_size

    def _all_reduce_in(self, tensor: torch.Tensor, tag: str, group: str) -> PendingAllReduce:
        """Start summing `tensor` over this rank's `group` (shard or replicate) inside its named range."""
        pg = self.shard_group if group == SHARD_GROUP else self.replicate_group
        name = self._names.get((tag, group))
        if name is None:
            name = self._names[(tag, group)] = comm_range(ALL_REDUCE, tag, group)
        flight = self.collectives.start(name, nbytes(tensor), lambda: self._all_reduce(tensor, group=pg, async_op=True))
        return PendingAllReduce(tensor, flight)

    def _finish_reduce(self, state: UnitState) -> None:
        """A reduce-scatter done: start the all-reduces across replicas of the shards whose reduce-scatters have
        all completed, in the order they were issued (the same on every rank, whatever order the host saw
        them complete in: gloo runs a group's collectives on more than one thread)."""
        super()._finish_reduce(state)
        if self.replicas == 1:  # one replica: nothing to sum across
            return
        for issued in self._rs_issued:
            if id(issued) in self._replica_sums:
                continue
            if issued.reduce is not None or issued.flat is not None:
                break
            self._replica_sums[id(issued)] = self._all_reduce_in(issued.unit.grad, issued.unit.name, REPLICATE_GROUP)

    def _on_replicated_grad(self, p: torch.Tensor, name: str) -> None:
        if any(pending.tensor is p.grad for pending in self._pending_ar):
            raise RuntimeError(ACCUMULATION_ERROR)
        self._pending_ar.append(self._all_reduce_in(p.grad, name, SHARD_GROUP))  # type: ignore[arg-type]
        self._replicated_tags.append(name)

    def _reduce_across_replicas(self) -> None:
        """Wait for the shards' replica all-reduces; the replicated parameters' shard-group sums, then summed
        across replicas (what FSDP's `_synchronize` then waits for and divides)."""
        for pending in self._replica_sums.values():
            pending.wait()
        self._replica_sums.clear()
        if self.replicas == 1:
            self._replicated_tags = []
            return
        within = zip(self._pending_ar, self._replicated_tags, strict=True)
        self._pending_ar = [self._all_reduce_in(p.wait(), tag, REPLICATE_GROUP) for p, tag in within]
        self._replicated_tags = []
