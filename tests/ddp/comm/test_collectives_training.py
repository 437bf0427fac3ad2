"""DDP training with each point-to-point all-reduce equals single-process training (gloo/CPU).

All (implementation, collective) pairs train in one spawned group of WORLD ranks through
`ddp.verify`'s own machinery, so the check is the one `python -m ddp.verify` applies. Ranks start
from different random weights and train on different shards, so a collective that dropped or
mis-summed anything would leave them apart from each other and from the single-process run.
Three ranks: a ring with two distinct neighbours and chunks of unequal sizes. (Each collective on 1 to 4
ranks, 2 included, blocking and async, equals dist.all_reduce: tests/ddp/comm/test_collectives.py; the
wrappers call it alike whatever the world size, so a second training group of 2 ranks proved nothing more.)
"""

from __future__ import annotations

import pytest
from torch import nn

from ddp.launch.launcher import launch
from ddp.strategies.torch_ddp import TorchDDP
from ddp.training.config import RunConfig
from ddp.verify import RANK_TOLERANCE, compare, train_single_process, verify_worker

P2P_COLLECTIVES = ("ring", "reduce_broadcast")
# Every wrapper that takes a collective; TorchDDP runs torch's own all-reduce (tested below).
IMPLS = ("naive", "flat", "overlap", "overlap_bucket")
WORLD = 3


def _configs(world: int) -> list[RunConfig]:
    # A tiny bucket size gives overlap_bucket several buckets, so several async ops are in flight.
    return [
        RunConfig(
            impl=impl,
            model="toy",
            world_size=world,
            batch_size=4 * world,
            steps=3,
            warmup=0,
            bucket_mb=0.0005,
            optimizer="adamw",
            lr=1e-2,
            seed=0,
            collective=collective,
            backend="gloo",
        )
        for collective in P2P_COLLECTIVES
        for impl in IMPLS
    ]


@pytest.mark.ranks  # spawns ranks
def test_training_with_p2p_collectives_equals_single_process() -> None:
    world = WORLD
    configs = _configs(world)
    outcomes = launch(verify_worker, world, configs, backend="gloo", timeout_s=120)
    reference = train_single_process(configs[0])
    for cfg, outcome in zip(configs, outcomes, strict=True):
        diff, not_close = compare(reference, outcome["params"])
        assert not_close == 0, (
            f"{cfg.impl} with {cfg.collective} on {world} ranks: {not_close} elements not "
            f"close to single-process training (max |diff| {diff:.3g})"
        )
        assert outcome["rank_spread"] <= RANK_TOLERANCE, f"{cfg.impl} with {cfg.collective}: ranks disagree"


def test_torch_ddp_refuses_a_p2p_collective() -> None:
    with pytest.raises(ValueError, match="collective must be 'torch'"):
        TorchDDP(nn.Linear(2, 2), collective="ring")


def test_verify_cli_refuses_torch_impl_with_a_p2p_collective() -> None:
    from ddp import verify

    with pytest.raises(ValueError, match="only runs collective 'torch'"):
        verify.main(["--impl", "torch", "--collective", "ring"])  # fails before spawning ranks
