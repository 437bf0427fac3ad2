"""fsdp allocates nothing in a steady-state step but its gather buffers (issue 18): what forward, backward and
the gradient synchronisation of steps 2 to 4 allocate, recorded op by op (tests/ddp/strategies/step_allocations.py),
holds no storage asked for by the strategy's code except one regrown gather buffer per all-gather."""

from __future__ import annotations

import collections

import pytest
import torch

from ddp.launch.launcher import launch
from ddp.sharding.gradient_buffers import KEEP
from tests.ddp.strategies import fsdp_cases
from tests.ddp.strategies.step_allocations import steady_state_allocations

pytestmark = pytest.mark.ranks  # spawns 2 ranks

WORLD = 2
STRATEGY = ("ddp/strategies/", "ddp/sharding/", "ddp/grads/", "ddp/memory/")  # the strategies and their helpers
CASES = {
    "stack": {"model": "stack", "optimizer": "sgd"},
    "stack-prefetch1": {"model": "stack", "optimizer": "sgd", "kwargs": {"prefetch": 1}},
    "mixed": {"model": "mixed", "optimizer": "adamw"},  # a unit called twice, tied and frozen parameters
    "mixed-bf16": {"model": "mixed", "optimizer": "adamw", "kwargs": {"compute_dtype": torch.bfloat16}},
}


@pytest.fixture(scope="module")
def runs() -> dict:
    return dict(zip(CASES, launch(steady_state_allocations, WORLD, list(CASES.values()), timeout_s=240), strict=True))


def padded_bytes(module: torch.nn.Module, itemsize: int) -> int:
    """A unit's gathered bytes by shard_units.py's documented layout: each trainable parameter starts on a
    multiple of 64 elements, the whole is padded to a multiple of 64 * W."""
    end = 0
    for p in module.parameters():
        if p.requires_grad:
            end = -(-end // 64) * 64 + p.numel()
    return -(-end // (64 * WORLD)) * 64 * WORLD * itemsize


@pytest.mark.parametrize("case", list(CASES))
def test_a_steady_state_step_allocates_only_one_gather_buffer_per_all_gather(runs, case):
    run = runs[case]
    model = fsdp_cases.build(CASES[case]["model"], seed=0)
    wire = torch.empty((), dtype=CASES[case].get("kwargs", {}).get("compute_dtype", torch.float32)).element_size()
    for step in run["steps"][1:]:
        # each unit is gathered before each forward call, and once more for its backward (then kept until its
        # gradient is complete, whatever the calls)
        expected = collections.Counter()
        for name in run["units"]:
            expected[("UntypedStorage.resize_", padded_bytes(model.get_submodule(name), wire))] += (
                step["calls"][name] + 1
            )
        mine = [a for a in step["allocations"] if a.where.startswith(STRATEGY)]
        assert collections.Counter((a.op, a.nbytes) for a in mine) == expected
        assert all(a.where == "ddp/sharding/unit_state.py:gather_buffers" for a in mine)
    first, *later = [[(a.op, a.nbytes) for a in step["allocations"]] for step in run["steps"][1:]]
    assert all(other == first for other in later)  # everything else (autograd's own) is the same every step


@pytest.mark.parametrize("case", list(CASES))
def test_the_flat_gradient_buffers_are_allocated_once_and_reused(runs, case):
    buffers = runs[case]["buffers"]
    assert all(step == buffers[0] for step in buffers)
    if case.startswith("stack"):  # no unit is called twice: KEEP buffers serve every unit in turn
        assert len(buffers[0]) == KEEP
