"""ShardedOptimizer: optimizer-state sharding (ZeRO stage 1) around any torch.optim optimizer.

Every rank holds all parameters and (after the data-parallel wrapper's synchronisation) the same mean
gradients, but each parameter is *owned* by one rank: only its owner keeps optimizer state for it and
steps it; then each rank broadcasts the parameters it owns, so every rank ends the step with the same
parameters as an unsharded optimizer would give (the same update, computed once instead of W times).
Ownership is balanced by size: parameters in decreasing numel order, each to the rank owning the
fewest elements so far (the same on every rank: no communication to agree on it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.distributed as dist

from contract import BROADCAST, comm_range
from ddp.comm import nvtx_ranges


def assign_owners(sizes: list[int], loads: list[int]) -> list[int]:
    """The owning rank of each of `sizes` (numels), greedily by decreasing size onto the least-loaded
    rank (lowest rank on a tie); `loads` (elements each rank owns already) is updated in place."""
    owners = [0] * len(sizes)
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        rank = min(range(len(loads)), key=lambda r: (loads[r], r))
        owners[i] = rank
        loads[rank] += sizes[i]
    return owners


class ShardedOptimizer(torch.optim.Optimizer):
    """`optimizer_cls(params, **kwargs)` with its state and its step split across the ranks of `group`.

    Use it as the optimizer it wraps: `param_groups` holds every parameter (with every hyperparameter
    the wrapped optimizer fills in, so schedulers work), `add_param_group` assigns the new parameters
    owners, `zero_grad` clears every gradient. `step()` steps this rank's share, then broadcasts each
    rank's share (one flat `comm:broadcast:optimizer_shard<r>` per rank and dtype/device).
    `local_optimizer` is the wrapped optimizer over this rank's share; `state` is its state.
    """

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
        optimizer_cls: type[torch.optim.Optimizer],
        group: dist.ProcessGroup | None = None,
        **kwargs: Any,
    ):
        if not dist.is_initialized():
            raise RuntimeError("ShardedOptimizer needs torch.distributed initialised first")
        self.process_group = group
        self.world_size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self._loads = [0] * self.world_size
        self.owner: dict[torch.Tensor, int] = {}
        self.local_optimizer: torch.optim.Optimizer | None = None
        self._optimizer_cls, self._kwargs = optimizer_cls, kwargs
        super().__init__(params, defaults=dict(kwargs))  # calls add_param_group for each group
        groups = [self._local_group(g) for g in self.param_groups]
        self.local_optimizer = optimizer_cls(groups, **kwargs)
        for mine, local in zip(self.param_groups, self.local_optimizer.param_groups, strict=True):
            self._fill_defaults(mine, local)
        self.state = self.local_optimizer.state

    # ---- torch.optim.Optimizer interface ------------------------------------------------------
    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a group: every rank keeps it in `param_groups`; each parameter gets an owner, and the
        owner's wrapped optimizer gets the group with its share of the parameters."""
        super().add_param_group(param_group)
        added = self.param_groups[-1]
        owners = assign_owners([p.numel() for p in added["params"]], self._loads)
        self.owner.update(zip(added["params"], owners, strict=True))
        if self.local_optimizer is not None:  # after construction: a new group of the wrapped optimizer too
            self.local_optimizer.add_param_group(self._local_group(added))
            self._fill_defaults(added, self.local_optimizer.param_groups[-1])

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        """Step this rank's share with the wrapped optimizer, then give every rank every share."""
        assert self.local_optimizer is not None
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for mine, local in zip(self.param_groups, self.local_optimizer.param_groups, strict=True):
            local.update({k: v for k, v in mine.items() if k != "params"})  # schedulers change ours
        self.local_optimizer.step()
        self._broadcast_shards()
        return loss

    def state_dict(self) -> dict[str, Any]:
        """This rank's share of the state (the wrapped optimizer's state_dict): save one per rank."""
        assert self.local_optimizer is not None
        return self.local_optimizer.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load what `state_dict()` saved on this rank (same world size and parameters)."""
        assert self.local_optimizer is not None
        self.local_optimizer.load_state_dict(state_dict)

    # ---- accounting ----------------------------------------------------------------------------
    def owned_parameters(self, rank: int | None = None) -> list[torch.Tensor]:
        """The parameters `rank` (default: this rank) owns, in `param_groups` order."""
        rank = self.rank if rank is None else rank
        return [p for g in self.param_groups for p in g["params"] if self.owner[p] == rank]

    def state_bytes(self) -> int:
        """Bytes of optimizer state this rank holds (tensors in the wrapped optimizer's state)."""
        assert self.local_optimizer is not None
        return state_bytes(self.local_optimizer)

    # ---- internals -----------------------------------------------------------------------------
    def _global_rank(self, rank: int) -> int:
        return rank if self.process_group is None else dist.get_global_rank(self.process_group, rank)

    def _local_group(self, group: dict[str, Any]) -> dict[str, Any]:
        mine = [p for p in group["params"] if self.owner[p] == self.rank]
        return {**{k: v for k, v in group.items() if k != "params"}, "params": mine}

    @staticmethod
    def _fill_defaults(mine: dict[str, Any], local: dict[str, Any]) -> None:
        """Give our group every hyperparameter the wrapped optimizer filled in (betas, eps, ...)."""
        for key, value in local.items():
            if key != "params":
                mine.setdefault(key, value)

    def _broadcast_shards(self) -> None:
        """Each rank's updated parameters to every rank: one flat broadcast per owner and dtype/device."""
        if self.world_size == 1:
            return
        for rank in range(self.world_size):
            by_kind: dict[tuple[torch.dtype, torch.device], list[torch.Tensor]] = {}
            for p in self.owned_parameters(rank):
                by_kind.setdefault((p.dtype, p.device), []).append(p)
            for params in by_kind.values():
                flat = torch.cat([p.detach().reshape(-1) for p in params])
                name = comm_range(BROADCAST, f"optimizer_shard{rank}")
                with nvtx_ranges.range(name, payload=flat.numel() * flat.element_size()):
                    dist.broadcast(flat, src=self._global_rank(rank), group=self.process_group)
                if rank != self.rank:
                    offset = 0
                    for p in params:
                        p.copy_(flat[offset : offset + p.numel()].view_as(p))
                        offset += p.numel()


def state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of the tensors in `optimizer.state` (each storage once)."""
    seen: set[int] = set()
    total = 0
    for per_param in optimizer.state.values():
        for value in per_param.values():
            if torch.is_tensor(value) and value.untyped_storage().data_ptr() not in seen:
                seen.add(value.untyped_storage().data_ptr())
                total += value.untyped_storage().nbytes()
    return total
