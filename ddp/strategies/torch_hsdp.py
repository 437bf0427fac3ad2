"""TorchHSDP (registry name `torch_hsdp`): PyTorch's FSDP2 on a 2-D DeviceMesh (replicate, shard), the reference
for `hsdp` as `torch_fsdp` is for `fsdp`.

`fully_shard` on a mesh of shape (W / S, S) named ("replicate", "shard") is FSDP2's own HSDP: each parameter is
sharded over the S ranks of a shard group (consecutive ranks, contract.hsdp_layout), gathered and
reduce-scattered there through `torch_fsdp`'s timed hooks (ranges `comm:all_gather:<unit>@shard`,
`comm:reduce_scatter:<unit>@shard`), and FSDP2 then all-reduces each reduce-scattered shard across the
replicate group itself (`dist.all_reduce` in FSDP2's reduce path: there is no custom-comm hook for it, so it
has no `comm:` range of ours; torch.profiler records it with its group). Reductions are forced to sums,
divided by W once at the end (`set_force_sum_reduction_for_comms`): gloo has no averaging all-reduce, and the
sums then match `hsdp`'s bit for bit on 2 x 2.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh

from contract import REPLICATE_GROUP, SHARD_GROUP, default_shard_size, hsdp_layout
from ddp.strategies.torch_fsdp import ShardSpec, TorchFSDP


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
        for _, unit in self.units:
            unit.set_force_sum_reduction_for_comms(True)  # type: ignore[operator]

    def _device_mesh(self, module: nn.Module) -> Any:
        shards, _ = hsdp_layout(self.world_size, self._shard_size)  # checks the shard size, one line
        device = next(iter(module.parameters()), torch.empty(0)).device.type
        return init_device_mesh(device, (len(shards), self._shard_size), mesh_dim_names=(REPLICATE_GROUP, SHARD_GROUP))
