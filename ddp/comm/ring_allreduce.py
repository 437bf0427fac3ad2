"""Ring all-reduce built from point-to-point messages: reduce-scatter, then all-gather.

The flattened tensor is cut into one chunk per rank. In the reduce-scatter phase every rank
passes one chunk to its right neighbour and adds the chunk arriving from its left neighbour,
n-1 times; afterwards rank r holds the complete sum of chunk (r+1) mod n. The all-gather phase
then circulates those finished chunks n-1 more times, overwriting instead of adding. Each rank
sends and receives 2(n-1)/n of the tensor in total, independent of n: the bandwidth-optimal
schedule NCCL's ring uses, and the reason bus bandwidth is defined as algbw * 2(n-1)/n.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from contract import RING_ALL_GATHER, RING_REDUCE_SCATTER
from ddp.comm.nvtx_ranges import range as nvtx_range
from ddp.comm.p2p_work import contiguous_flat, resolved_group


def chunk_bounds(numel: int, parts: int) -> list[tuple[int, int]]:
    """[start, end) of `parts` contiguous chunks covering `numel` elements, sizes differing by at most one."""
    base, extra = divmod(numel, parts)
    bounds, start = [], 0
    for i in range(parts):
        end = start + base + (1 if i < extra else 0)
        bounds.append((start, end))
        start = end
    return bounds


def _exchange(send: torch.Tensor, dst: int, recv: torch.Tensor, src: int, group: dist.ProcessGroup | None) -> None:
    """Send `send` to dst while receiving `recv` from src; empty buffers are skipped on both sides."""
    works = []
    # Both ends know every chunk size, so a zero-sized chunk is skipped symmetrically.
    if send.numel():
        works.append(dist.isend(send, dst, group=group))
    if recv.numel():
        works.append(dist.irecv(recv, src, group=group))
    for work in works:
        if work is not None:  # None only on a rank outside `group`
            work.wait()


@torch.no_grad()  # in-place on tensors that may require grad, like dist.all_reduce
def ring_all_reduce(tensor: torch.Tensor, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """In-place SUM of `tensor` over `group` (default: the world) with a ring; returns the tensor."""
    world = dist.get_world_size(group)
    if world == 1 or tensor.numel() == 0:
        return tensor
    rank = dist.get_rank(group)
    ranks_group = resolved_group(group)
    right = dist.get_global_rank(ranks_group, (rank + 1) % world)
    left = dist.get_global_rank(ranks_group, (rank - 1) % world)
    with contiguous_flat(tensor) as flat:
        chunks = [flat[a:b] for a, b in chunk_bounds(flat.numel(), world)]
        with nvtx_range(RING_REDUCE_SCATTER):
            incoming = torch.empty_like(chunks[0])  # chunk 0 is the largest
            for step in range(world - 1):
                send_idx, recv_idx = (rank - step) % world, (rank - step - 1) % world
                buf = incoming[: chunks[recv_idx].numel()]
                _exchange(chunks[send_idx], right, buf, left, group)
                chunks[recv_idx].add_(buf)

        with nvtx_range(RING_ALL_GATHER):
            for step in range(world - 1):
                send_idx, recv_idx = (rank + 1 - step) % world, (rank - step) % world
                # Receive straight into place: the chunk being overwritten is not the one being sent.
                _exchange(chunks[send_idx], right, chunks[recv_idx], left, group)
    return tensor
