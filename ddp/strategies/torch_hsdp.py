"""TorchHSDP (registry name `torch_hsdp`): PyTorch's FSDP2 on a 2-D DeviceMesh (replicate, shard), the reference
for `hsdp` as `torch_fsdp` is for `fsdp`.

`fully_shard` on a mesh of shape (W / S, S) named ("replicate", "shard") is FSDP2's own HSDP: each parameter is
sharded over the S ranks of a shard group (consecutive ranks, contract.hsdp_layout), gathered and
reduce-scattered there through `torch_fsdp`'s timed hooks (ranges `comm:all_gather:<unit>@shard`,
`comm:reduce_scatter:<unit>@shard`), and FSDP2 then all-reduces each reduce-scattered shard across the
replicate group itself (`dist.all_reduce` in FSDP2's reduce path: there is no custom-comm hook for it). Its
push/pop range `comm:all_reduce:<unit>@replicate` (payload the shard's bytes) brackets that call on the host:
opened when the unit's reduce-scatter returns (FSDP2 issues the all-reduce next, on the same thread) and closed
by FSDP2's all-reduce hook (`set_all_reduce_hook`, which native HSDP runs right after its all-reduce). On gloo
the all-reduce is blocking, so the range is its duration; on CUDA it holds the all-reduce's launch, which is
what the analysis matches a kernel to. It is not timed by the wrapper's CommTimer (the benchmark's comm time
leaves it out, as before). Reductions are forced to sums,
divided by W once at the end (`set_force_sum_reduction_for_comms`): gloo has no averaging all-reduce, and the
sums then match `hsdp`'s bit for bit on 2 x 2.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh

from contract import ALL_REDUCE, REPLICATE_GROUP, SHARD_GROUP, comm_range, default_shard_size, hsdp_layout
from ddp.comm import nvtx_ranges
from ddp.strategies.base import nbytes
from ddp.strategies.torch_fsdp import ShardSpec, TimedReduceScatter, TorchFSDP


class TorchHSDP(TorchFSDP):
    """FSDP2's HSDP around `module` with shard groups of `shard_size` ranks (None: contract.default_shard_size);
    see the module docstring."""

    shard_group_name = SHARD_GROUP

    def __init__(
        self,
        module: nn.Module,
        compute_dtype: torch.dtype | None = None,
        *,
        shard_size: int | None = None,
        shard: ShardSpec = (nn.Linear, nn.Embedding),
        collective: str = "torch",
        prefetch: int | None = None,
    ):
        self._shard_size = default_shard_size(dist.get_world_size()) if shard_size is None else shard_size
        super().__init__(module, compute_dtype, shard=shard, collective=collective, prefetch=prefetch)
        self.shard_world = self._shard_size
        for tag, unit in self.units:
            unit.set_force_sum_reduction_for_comms(True)  # type: ignore[operator]
            reduce_scatter = ReplicateBracketed(self, tag, SHARD_GROUP)
            unit.set_custom_reduce_scatter(reduce_scatter)  # type: ignore[operator]
            unit.set_all_reduce_hook(reduce_scatter.all_reduced)  # type: ignore[operator]

    def _device_mesh(self, module: nn.Module) -> Any:
        shards, _ = hsdp_layout(self.world_size, self._shard_size)  # checks the shard size, one line
        device = next(iter(module.parameters()), torch.empty(0)).device.type
        return init_device_mesh(device, (len(shards), self._shard_size), mesh_dim_names=(REPLICATE_GROUP, SHARD_GROUP))


class ReplicateBracketed(TimedReduceScatter):
    """A unit's timed reduce-scatter that, once issued, opens the range of the all-reduce across replicas FSDP2
    issues next; `all_reduced` (FSDP2's all-reduce hook) closes it (see the module docstring)."""

    def __init__(self, owner: TorchFSDP, tag: str, group: str | None = None):
        super().__init__(owner, tag, group)
        self.replicate_name = comm_range(ALL_REDUCE, tag, REPLICATE_GROUP)
        self.open: contextlib.AbstractContextManager | None = None

    def __call__(
        self,
        output_tensor: torch.Tensor,
        input_tensor: torch.Tensor,
        group: dist.ProcessGroup,
        op: Any,
        async_op: bool = False,
    ) -> Any:
        work = super().__call__(output_tensor, input_tensor, group, op, async_op)
        self.all_reduced(output_tensor)  # a range left open (no all-reduce followed the last one) ends here
        # a push/pop range, like every blocking collective's (gloo's all-reduce blocks; its hook runs on this thread)
        self.open = nvtx_ranges.range(self.replicate_name, payload=nbytes(output_tensor))
        self.open.__enter__()
        return work

    def all_reduced(self, _reduce_output: torch.Tensor) -> None:
        """FSDP2's all-reduce hook: the all-reduce across replicas was issued (on gloo: done); close its range."""
        if self.open is not None:
            self.open.__exit__(None, None, None)
            self.open = None
