"""HSDP (`hsdp`) and its FSDP2 reference (`torch_hsdp`) on 4 gloo ranks, 2 replicas x 2 shards: parameters after
every step equal, bit for bit, one process summing each shard group's rank slices (ranks 0+1, 2+3) and then the
two sums, divided by 4; each rank stores half of every unit (its shard group's share), and the replicas agree."""

from __future__ import annotations

import pytest
import torch

from ddp.launch.launcher import launch
from tests.ddp.strategies import fsdp_cases

pytestmark = pytest.mark.ranks  # every test reads the runs of spawned ranks (module fixture)

STEPS, BATCH, WORLD, SHARD = 3, 8, 4, 2
SHARD_GROUPS = [[0, 1], [2, 3]]
CASES = {
    ("hsdp", "mixed", "adamw"): {},
    ("hsdp", "stack", "sgd"): {"prefetch": 1},
    ("torch_hsdp", "mixed", "adamw"): {},
}


@pytest.fixture(scope="module")
def runs() -> dict:
    cases = [
        {"impl": impl, "model": model, "optimizer": opt, "steps": STEPS, "batch_size": BATCH,
         "kwargs": {"shard_size": SHARD, **kwargs}, "ranges": True}
        for (impl, model, opt), kwargs in CASES.items()
    ]  # fmt: skip
    everyone = launch(fsdp_cases.every_rank_worker, WORLD, cases, timeout_s=240)
    return {key: [rank[i] for rank in everyone] for i, key in enumerate(CASES)}


@pytest.mark.parametrize("key", list(CASES), ids="-".join)
def test_parameters_equal_the_shard_then_replica_sum_bit_for_bit_after_every_step(runs, key):
    _, model, opt = key
    outcome = runs[key][0]
    reference = fsdp_cases.train_reference(
        model, opt, STEPS, BATCH, WORLD, threads=outcome["threads"], groups=SHARD_GROUPS
    )
    for step, (got, want) in enumerate(zip(outcome["history"], reference, strict=True)):
        assert got.keys() == want.keys()
        for name, value in want.items():
            assert torch.equal(got[name], value), f"step {step} {name}: {float((got[name] - value).abs().max()):.3g}"
    first = fsdp_cases.build(model, seed=0).state_dict()
    assert any(not torch.equal(outcome["history"][-1][n], first[n]) for n in first)  # it trained


@pytest.mark.parametrize("key", [k for k in CASES if k[0] == "hsdp"], ids="-".join)
def test_a_shard_group_holds_each_unit_once_and_the_replicas_hold_the_same_shards(runs, key):
    shapes = [{n: torch.Size(s[0]).numel() for n, s in rank["shards"].items()} for rank in runs[key]]
    full = {n: p.numel() for n, p in fsdp_cases.build(key[1], seed=0).named_parameters()}
    sharded = [n for n in full if shapes[0][n] + shapes[1][n] == full[n] and shapes[0][n] < full[n]]
    replicated = [n for n in full if shapes[0][n] == shapes[1][n] == full[n]]
    assert sharded and sorted(sharded + replicated) == sorted(full)
    assert shapes[2] == shapes[0] and shapes[3] == shapes[1]


@pytest.mark.parametrize("key", list(CASES), ids="-".join)
def test_every_rank_ends_with_the_same_parameters(runs, key):
    ranks = runs[key]
    for other in ranks[1:]:
        assert all(torch.equal(v, other["history"][-1][n]) for n, v in ranks[0]["history"][-1].items())


@pytest.mark.parametrize("key", list(CASES), ids="-".join)
def test_each_collectives_range_names_its_group(runs, key):
    """Gathers and reduce-scatters in the shard group; the all-reduces: each unit's gradient shard across
    replicas (torch_hsdp's: FSDP2's own, bracketed by our range), and hsdp's each replicated parameter within
    the shard group and then across."""
    names = [n for n in runs[key][0]["ranges"] if n != "comm:broadcast:params"]
    ops = {(n.split(":")[1], n.rsplit("@", 1)[-1]) for n in names}
    tags = lambda op, group: {
        n.split(":")[2].split("@")[0] for n in names if n.endswith(f"@{group}") and f":{op}:" in n
    }
    assert all("@" in n for n in names)
    if key[0] == "torch_hsdp":
        assert ops == {("all_gather", "shard"), ("reduce_scatter", "shard"), ("all_reduce", "replicate")}
        units = tags("reduce_scatter", "shard")
        assert tags("all_reduce", "replicate") == units <= tags("all_gather", "shard")  # a frozen unit: gathered only
        counts = [sum(f":{op}:" in n for n in names) for op in ("reduce_scatter", "all_reduce")]
        assert counts[0] == counts[1]  # one all-reduce range per reduce-scatter
        return
    assert ops == {
        ("all_gather", "shard"),
        ("reduce_scatter", "shard"),
        ("all_reduce", "shard"),
        ("all_reduce", "replicate"),
    }
    units = tags("reduce_scatter", "shard")
    assert tags("all_gather", "shard") == units and tags("all_reduce", "replicate") == units | tags(
        "all_reduce", "shard"
    )
