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


if __name__ == "__main__":
    try:
        launch(stall_at_step_1, None, sys.argv[1], 1)
    except RankFailedError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(1)
