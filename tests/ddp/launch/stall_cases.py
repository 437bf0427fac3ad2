"""Rank workers for the stall tests: one rank stops before a step's collectives (spawned ranks import these).

torchrun --nproc-per-node 2 -m tests.ddp.launch.stall_cases IMPL   # the same under torchrun (DDP_TIMEOUT_S applies)
"""

from __future__ import annotations

import sys
import time

import torch.nn.functional as F

from ddp.comm import inflight
from ddp.launch.launcher import DistContext, RankFailedError, launch
from ddp.strategies import registry
from tests.ddp.cases import batch, build

STALL_S = 600  # far longer than any test: only the launcher's or torchrun's kill ends it


def stall_at_step_1(ctx: DistContext, impl: str, stalled_rank: int) -> None:
    """Train `impl` on the toy model; `stalled_rank` stops before step 1 and never reaches its collectives."""
    wrapper = registry.wrap(impl, build("toy", seed=0))
    x, y = batch(0, 8)
    for step in range(3):
        if step == 1 and ctx.rank == stalled_rank:
            time.sleep(STALL_S)
        F.cross_entropy(wrapper(x), y).backward()
        wrapper.finish_gradient_synchronization()


def never_completes(ctx: DistContext, ranks_inside: list[int]) -> None:
    """Ranks in `ranks_inside` enter a collective that never completes and that no backend times out."""
    if ctx.rank in ranks_inside:
        inflight.begin("comm:all_reduce:never")
    time.sleep(STALL_S)


def join_late(rank: int, port: int, late_s: float, timeout_s: float, results) -> None:
    """Rank `rank` of two joins the group (rank 1 `late_s` after rank 0) with a `timeout_s` collective
    timeout, then sums its rank number with the other's; puts (rank, sum) or (rank, error) into results."""
    import torch
    import torch.distributed as dist

    from ddp.launch import launcher

    try:
        if rank == 1:
            time.sleep(late_s)
        launcher._setup_rank(rank, rank, 2, 2, "gloo", timeout_s, ("127.0.0.1", port))
        total = torch.tensor([float(rank)])
        dist.all_reduce(total)
        dist.destroy_process_group()
        results.put((rank, float(total.item())))
    except Exception as exc:  # the test names it
        results.put((rank, f"{type(exc).__name__}: {exc}"))


if __name__ == "__main__":
    try:
        launch(stall_at_step_1, None, sys.argv[1], 1)
    except RankFailedError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(1)
