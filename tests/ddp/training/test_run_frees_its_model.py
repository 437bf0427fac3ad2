"""run_training frees its model when it returns: a sweep's next setting never runs beside the last one's tensors.

Autograd keeps gradient hooks and DDP's comm-hook state in C++, out of the cyclic collector's sight: a hook that
refers back to its wrapper keeps the wrapper, its parameters, gradients and buckets allocated for good (on a GPU,
each setting of a sweep then added its model's parameters and gradients to the next one's peak).
"""

from __future__ import annotations

import contextlib
import gc
import weakref

import pytest
import torch

from ddp.launch.launcher import DistContext
from ddp.strategies import registry
from ddp.strategies.base import DataParallelBase
from ddp.training.config import RunConfig
from ddp.training.loop import run_training

ONE_RANK = DistContext(
    rank=0, local_rank=0, world_size=1, local_world_size=1, backend="gloo", device=torch.device("cpu")
)


def tensors_of(model: DataParallelBase) -> list[torch.Tensor]:
    """What a run allocates for its model: parameters, buffers, gradients and the wrapper's comm buffers."""
    params = [*model.module.parameters(), *model.parameters()]
    grads = [p.grad for p in params if p.grad is not None]
    return [*params, *model.module.buffers(), *grads, *model.comm_buffers()]


@pytest.mark.parametrize("impl", list(registry.IMPLEMENTATIONS))
def test_a_run_leaves_nothing_of_its_model_alive_for_the_next(one_rank_group, impl):
    cfg = RunConfig(impl=impl, model="toy", world_size=1, batch_size=4, steps=1, warmup=1, optimizer="adamw")
    runs: list[list[weakref.ref]] = []  # per run: weak references to its wrapper and tensors
    alive_at_next_start: list[int] = []  # per run: how many of the previous run's objects were alive

    def region(model: DataParallelBase, _memory: dict | None) -> contextlib.AbstractContextManager:
        """Called after the warm-up step (gradients and buckets exist): note this run's objects."""
        alive_at_next_start.append(sum(ref() is not None for ref in runs[-1]) if runs else 0)
        runs.append([weakref.ref(model), *map(weakref.ref, tensors_of(model))])
        return contextlib.nullcontext()

    gc.disable()  # only run_training's own collection may free a cycle, not one that happens to run meanwhile
    try:
        losses = [run_training(ONE_RANK, cfg, region).final_loss for _ in range(2)]
        alive_after_return = sum(ref() is not None for ref in runs[-1])
    finally:
        gc.enable()
    assert len(runs) == 2 and len(runs[0]) > 3  # the wrapper, and its parameters at least
    assert alive_at_next_start == [0, 0]
    assert alive_after_return == 0
    assert losses[0] == losses[1]  # the same seed trains alike: the hooks still did their work
