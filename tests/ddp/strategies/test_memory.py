"""Memory accounting: each wrapper's parts against a count written here from the model's shapes."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

from contract import MEMORY_PARTS
from ddp.launch.launcher import launch
from ddp.memory.accounting import MIB, MemoryParts, SavedTensorBytes, optimizer_state_bytes as state_bytes
from ddp.sharding.gradient_buffers import KEEP
from ddp.strategies import registry
from ddp.training.loop import make_optimizer, train_step
from ddp.training.models import build_model
from tests.ddp import cases
from tests.ddp.strategies import memory_cases

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


@pytest.mark.parametrize("impl", registry.REPLICATED)  # torch_fsdp: tests/ddp/strategies/test_torch_fsdp.py
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


def test_peak_is_the_sum_of_the_parts():
    parts = MemoryParts(parameters=MIB, gradients=MIB, optimizer_state=2 * MIB, activations=MIB // 2, comm_buffers=7)
    assert parts.peak == 4.5 * MIB + 7
    assert parts.as_bytes() == {
        "parameters": MIB,
        "gradients": MIB,
        "optimizer_state": 2 * MIB,
        "gathered": 0,
        "comm_buffers": 7,
        "activations": MIB // 2,
        "peak": 4.5 * MIB + 7,
    }
    assert parts.as_mib()["peak"] == 4.5 and parts.as_mib()["gathered"] == 0


def test_what_skip_claims_is_not_an_activation():
    """A sharded wrapper's gathered weights, saved by the layers that use them, are `gathered`, not activations."""
    weight = torch.randn(32, 16, requires_grad=True)
    gathered = weight.detach().clone().requires_grad_()  # stands for a full weight gathered into a buffer
    x = torch.randn(8, 16, requires_grad=True)
    key = gathered.untyped_storage().data_ptr()
    with SavedTensorBytes(skip=lambda t: t.untyped_storage().data_ptr() == key) as saved:
        F.linear(x, gathered).sum().backward()
    assert saved.bytes == F32 * 8 * 16  # linear saved x and the weight: only x counts
    with SavedTensorBytes() as everything:
        F.linear(x, gathered).sum().backward()
    assert everything.bytes == F32 * (8 * 16 + 32 * 16)


def test_a_tied_weight_is_counted_once(one_rank_group):
    model = registry.wrap("flat", cases.build("tied", 0))
    x, y = cases.batch(0, 8)
    F.cross_entropy(model(x), y).backward()
    model.finish_gradient_synchronization()
    unique = {id(p): p for p in model.module.parameters()}.values()
    assert model.memory_parts().parameters == F32 * sum(p.numel() for p in unique)
    assert torch.is_tensor(model.module.fc2.weight.grad)


# ---- two ranks through the training loop: what ddp.benchmark and ddp.meta report ----------------------------
def own_greedy_owners(sizes: list[int], world: int) -> list[int]:
    """ShardedOptimizer's documented rule, written out here: largest first, to the rank owning least so far."""
    loads, owners = [0] * world, [0] * len(sizes)
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        owners[i] = loads.index(min(loads))
        loads[owners[i]] += sizes[i]
    return owners


def expected_toy_figures(impl: str, shard: bool, rank: int, world: int, batch: int) -> dict[str, int]:
    """Bytes one rank should account for the toy MLP trained with AdamW, from its parameters' shapes."""
    net = build_model("toy")
    sizes = [p.numel() for p in net.parameters()]
    comm, flags = expected_comm_and_flags(impl, sizes)
    owned = [s for s, o in zip(sizes, own_greedy_owners(sizes, world), strict=True) if not shard or o == rank]
    b = batch // world
    figures = {
        "parameters": sum(p.numel() * p.element_size() for p in net.parameters()),
        "gradients": F32 * (sum(sizes) + flags),
        "optimizer_state": F32 * (2 * sum(owned) + len(owned)),  # exp_avg, exp_avg_sq; a float32 step each
        "gathered": 0,
        "comm_buffers": F32 * comm,
        # as the test above counts, but a rank's inputs and targets are slices of the global batch's
        # tensors: what they keep alive is the whole batch's storage
        "activations": F32 * (batch * 16 + b * 32 + b * 32 + b * 4) + batch * 8 + F32,
    }
    return {**figures, "peak": sum(figures.values()), "cuda_max_allocated": None}


TOY_RUN = {"model": "toy", "world_size": 2, "batch_size": 8, "steps": 1, "warmup": 1, "optimizer": "adamw"}


def fsdp_toy_layout(world: int) -> list[tuple[int, list[tuple[int, int]]]]:
    """fsdp's flat layout of each toy Linear, as ddp/sharding/shard_units.py documents it: (padded elements,
    [(offset, numel) per parameter]); each parameter starts on a multiple of 64 elements, the vector is
    padded to a multiple of world * 64."""
    layout = []
    for linear in build_model("toy").children():
        places, offset = [], 0
        for p in linear.parameters():
            places.append((offset, p.numel()))
            offset += -(-p.numel() // 64) * 64
        end = places[-1][0] + places[-1][1]
        layout.append((-(-end // (world * 64)) * world * 64, places))
    return layout


def expected_sharded_toy_figures(impl: str, rank: int, world: int, batch: int) -> dict[str, int]:
    """A sharded strategy's bytes for the toy MLP with AdamW: this rank's slice of every parameter (padded as
    the strategy pads), its gradient, AdamW's two moments of the slice's real elements and a float32 step
    counter per parameter; the gathered buffers: fsdp's two units in a row (prefetch 2), FSDP2's as
    ddp/memory/fsdp2_gathered.py describes."""
    net = build_model("toy")
    if impl == "fsdp":
        layout = fsdp_toy_layout(world)
        shard = sum(padded // world for padded, _ in layout)
        lo = [(rank * padded // world, (rank + 1) * padded // world) for padded, _ in layout]
        owned = sum(
            max(0, min(hi, off + n) - max(start, off))
            for (start, hi), (_, places) in zip(lo, layout, strict=True)
            for off, n in places
        )
        gathered = F32 * max(a[0] + b[0] for a, b in itertools.pairwise(layout))
        comm = KEEP * F32 * max(padded for padded, _ in layout)  # the flat gradient buffers the units share
    else:  # torch_fsdp: FSDP2 pads each parameter's dim 0 to a multiple of the world size (the toy's need none)
        shard = owned = sum(p.numel() for p in net.parameters()) // world
        # no root parameters; at a Linear's copy-out FSDP2 holds the Linear before's all-gather output and the
        # Linear twice (its output and unsharded copy): ddp/memory/fsdp2_gathered.py
        units = [0] + [sum(p.numel() for p in linear.parameters()) for linear in net.children()]
        gathered, comm = F32 * max(before + 2 * unit for before, unit in itertools.pairwise(units)), 0
    count = len(list(net.parameters()))
    figures = {
        "parameters": F32 * shard,
        "gradients": F32 * shard,
        "optimizer_state": F32 * (2 * owned + count),
        "comm_buffers": comm,
        "activations": expected_toy_figures("naive", False, 0, world, batch)["activations"],
    }
    return {**figures, "gathered": gathered}


IMPLS = [name for name in registry.IMPLEMENTATIONS if name not in registry.HYBRID]  # 2 ranks: one replica
TOY_CONFIGS = [{**TOY_RUN, "impl": impl, "shard_optimizer": shard} for impl in IMPLS for shard in (False, True)]
LM_RUN = {**TOY_RUN, "model": "tiny", "impl": "flat", "batch_size": 2, "context_length": 16}


@pytest.fixture(scope="module")
def two_rank_runs() -> list[dict]:
    """memory_of_runs of every TOY_CONFIGS run, then LM_RUN's, on the same two spawned ranks."""
    return launch(memory_cases.memory_of_runs, 2, [*TOY_CONFIGS, LM_RUN], timeout_s=240)


@pytest.mark.ranks
def test_each_strategy_accounts_what_a_count_from_the_shapes_gives_with_and_without_sharded_state(two_rank_runs):
    runs = two_rank_runs[: len(TOY_CONFIGS)]
    assert [r["settings"] for r in runs] == TOY_CONFIGS
    for run in runs:
        impl, shard = run["settings"]["impl"], run["settings"]["shard_optimizer"]
        if impl in registry.SHARDED:  # --shard-optimizer changes nothing: the state is the shards' already
            for r, rank in enumerate(run["after"]):
                expected = expected_sharded_toy_figures(impl, r, 2, 8)
                assert {k: rank[k] for k in expected} == expected, (impl, shard, r)
                assert rank["peak"] == sum(rank[k] for k in MEMORY_PARTS)
        else:
            expected_ranks = [expected_toy_figures(impl, shard, rank, 2, 8) for rank in range(2)]
            assert run["after"] == expected_ranks, (impl, shard)
        assert run["at_region"] == run["after"], (impl, shard)  # what ddp.meta records: the same after warm-up
    by_shard = {(r["settings"]["impl"], r["settings"]["shard_optimizer"]): r["after"] for r in runs}
    for impl in registry.REPLICATED:  # sharded: the ranks' states add up to the replicated state, each about half
        full = by_shard[impl, False][0]["optimizer_state"]
        shares = [rank["optimizer_state"] for rank in by_shard[impl, True]]
        assert sum(shares) == full  # every parameter's state lives on exactly one rank
        assert max(shares) <= full / 2 + F32 * (2 * 32 * 32 + 1)  # within one parameter (fc2.weight) of 1/W


@pytest.mark.ranks
def test_an_lm_counts_its_buffers_as_parameters(two_rank_runs):
    """The tiny LM (a buffer beside its parameters, tied weights if any): parameters and buffers counted once."""
    run = two_rank_runs[-1]
    assert run["settings"] == LM_RUN
    net = build_model("tiny", context_length=16)
    params = sum(p.numel() * p.element_size() for p in net.parameters())
    buffers = sum(b.numel() * b.element_size() for b in net.buffers())
    trainable = [p for p in net.parameters() if p.requires_grad]
    for rank in run["after"]:
        assert rank["parameters"] == params + buffers
        assert rank["gradients"] == F32 * sum(p.numel() for p in trainable)
        assert rank["comm_buffers"] == F32 * (sum(p.numel() for p in trainable) + len(trainable))
        assert rank["optimizer_state"] == F32 * (2 * sum(p.numel() for p in trainable) + len(trainable))
        assert rank["activations"] > 0 and rank["peak"] == sum(
            v for k, v in rank.items() if k not in ("peak", "cuda_max_allocated")
        )
