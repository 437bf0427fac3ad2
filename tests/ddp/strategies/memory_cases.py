"""Rank workers for the memory accounting tests (module level: spawned ranks import them)."""

from __future__ import annotations

import contextlib

import torch.distributed as dist

from ddp.launch.launcher import DistContext
from ddp.training.config import RunConfig
from ddp.training.loop import run_training


def memory_of_runs(ctx: DistContext, configs: list[dict]) -> list[dict]:
    """Train each config; per run every rank's memory figures after the last step (TrainResult.memory) and the
    ones handed to the measured region after the warm-up (what profiling writes into ddp.meta)."""
    out = []
    for settings in configs:
        at_region: list[dict | None] = []

        def region(_model, memory, at_region=at_region):
            at_region.append(memory)
            return contextlib.nullcontext()

        result = run_training(ctx, RunConfig(**settings), measured_region=region)
        everyone: list = [None] * ctx.world_size
        dist.all_gather_object(everyone, at_region[0])
        out.append({"settings": settings, "after": result.memory, "at_region": everyone})
    return out
