"""All-reduce as reduce-to-root then broadcast, both built from point-to-point messages.

Both phases walk a binomial tree rooted at `root`, so each takes ceil(log2 n) rounds instead of
n-1: in the reduce, at round k every rank whose (root-relative) rank has bit k set sends its
partial sum to the rank 2^k below it and drops out; in the broadcast the same tree is walked
backwards. Every message carries the whole tensor, so the root moves log2(n) full tensors
each way, where a ring moves 2(n-1)/n of one: cheap for small tensors, bandwidth-bound for large.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

from contract import REDUCE_BROADCAST_BROADCAST, REDUCE_BROADCAST_REDUCE
from ddp.comm.nvtx_ranges import range as nvtx_range
from ddp.comm.p2p_work import contiguous_flat, resolved_group


def _lowest_set_bit(vrank: int, world: int) -> int:
    """Size of the subtree a root-relative rank heads: its lowest set bit, or a power of two >= world for the root."""
    if vrank == 0:
        return 1 << max(world - 1, 0).bit_length()
    return vrank & -vrank


def reduce_to_root(flat: torch.Tensor, vrank: int, world: int, global_rank: Callable[[int], int]) -> None:
    """Binomial-tree SUM into vrank 0's `flat`; other ranks' `flat` end up holding partial sums."""
    incoming = torch.empty_like(flat)
    mask = 1
    while mask < world:
        if vrank & mask:
            dist.send(flat, global_rank(vrank - mask))
            return
        if vrank + mask < world:
            dist.recv(incoming, global_rank(vrank + mask))
            flat.add_(incoming)
        mask <<= 1


def broadcast_from_root(flat: torch.Tensor, vrank: int, world: int, global_rank: Callable[[int], int]) -> None:
    """Binomial-tree copy of vrank 0's `flat` to every rank: receive from the parent, then feed the children."""
    span = _lowest_set_bit(vrank, world)
    if vrank:
        dist.recv(flat, global_rank(vrank - span))
    child = span >> 1
    while child:  # farthest child first: its subtree is the largest and should start soonest
        if vrank + child < world:
            dist.send(flat, global_rank(vrank + child))
        child >>= 1


@torch.no_grad()  # in-place on tensors that may require grad, like dist.all_reduce
def reduce_broadcast_all_reduce(
    tensor: torch.Tensor, group: dist.ProcessGroup | None = None, root: int = 0
) -> torch.Tensor:
    """In-place SUM of `tensor` over `group` (default: the world) by reduce to `root` then broadcast."""
    world = dist.get_world_size(group)
    if not 0 <= root < world:
        raise ValueError(f"root must be a rank in [0, {world}), got {root}")
    if world == 1 or tensor.numel() == 0:
        return tensor
    ranks_group = resolved_group(group)
    vrank = (dist.get_rank(group) - root) % world

    def global_rank(v: int) -> int:
        return dist.get_global_rank(ranks_group, (v + root) % world)

    with contiguous_flat(tensor) as flat:
        with nvtx_range(REDUCE_BROADCAST_REDUCE):
            reduce_to_root(flat, vrank, world, global_rank)
        with nvtx_range(REDUCE_BROADCAST_BROADCAST):
            broadcast_from_root(flat, vrank, world, global_rank)
    return tensor
