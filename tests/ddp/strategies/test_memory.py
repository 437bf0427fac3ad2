"""Memory accounting: each wrapper's parts against a count written here from the model's shapes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ddp.optim.sharded_optimizer import state_bytes
from ddp.strategies import registry
from ddp.strategies.memory import MIB, MemoryParts, SavedTensorBytes
from ddp.training.loop import make_optimizer, train_step
from tests.ddp import cases

F32 = 4


def toy_sizes() -> list[int]:
    net = cases.build("toy", 0)
    return [p.numel() for p in net.parameters()]


# What each wrapper keeps for communicating beyond the gradients, in elements (N: all gradient
# elements, P: the parameters, S: the smallest parameter, which carries the "had a gradient" flags)
def expected_comm_and_flags(impl: str, sizes: list[int]) -> tuple[int, int]:
    """(communication-buffer elements, flag elements counted with the gradients)."""
    n, p, s = sum(sizes), len(sizes), min(sizes)
    return {
        "naive": (s + p, 0),
        "overlap": (s + p, 0),
        "flat": (n + p, 0),
        "overlap_bucket": (0, p),  # gradients are views into the buckets: [grads..., flags]
        "torch": (n, 0),  # DDP's bucket buffers, gradients copied out of them
    }[impl]


@pytest.mark.parametrize("impl", list(registry.IMPLEMENTATIONS))
def test_parts_match_a_count_from_the_shapes(one_rank_group, impl):
    sizes = toy_sizes()
    model = registry.wrap(impl, cases.build("toy", 0))
    opt = make_optimizer("adamw", model.module.parameters(), 0.01)
    for step in range(2):
        train_step(model, opt, cases.batch(step, 8), step)
    parts = model.memory_parts()
    comm, flags = expected_comm_and_flags(impl, sizes)
    assert parts.parameters == F32 * sum(sizes)
    assert parts.gradients == F32 * (sum(sizes) + flags)
    assert parts.comm_buffers == F32 * comm
    assert (parts.gathered, parts.optimizer_state, parts.activations) == (0, 0, 0)  # not the wrapper's
    # AdamW: exp_avg and exp_avg_sq per element, and a float32 step counter per parameter
    assert state_bytes(opt) == F32 * (2 * sum(sizes) + len(sizes))


def test_activations_are_what_forward_saved_for_backward():
    net = cases.build("toy", 0)
    x, y = cases.batch(0, 8)
    with SavedTensorBytes(exclude=net.parameters()) as saved:
        F.cross_entropy(net(x), y).backward()
    # fc1 saves its input, each ReLU its output (which the next Linear saves too), log_softmax its output,
    # nll_loss the targets (int64) and its total weight (a float32 scalar); the weights are excluded
    assert saved.bytes == F32 * (8 * 16 + 8 * 32 + 8 * 32 + 8 * 4) + 8 * 8 + F32


def test_total_and_mib():
    parts = MemoryParts(parameters=MIB, gradients=MIB, optimizer_state=2 * MIB, activations=MIB // 2)
    assert parts.total == 4.5 * MIB
    assert parts.as_mib()["total"] == 4.5 and parts.as_mib()["gathered"] == 0


def test_a_tied_weight_is_counted_once(one_rank_group):
    model = registry.wrap("flat", cases.build("tied", 0))
    x, y = cases.batch(0, 8)
    F.cross_entropy(model(x), y).backward()
    model.finish_gradient_synchronization()
    unique = {id(p): p for p in model.module.parameters()}.values()
    assert model.memory_parts().parameters == F32 * sum(p.numel() for p in unique)
    assert torch.is_tensor(model.module.fc2.weight.grad)
