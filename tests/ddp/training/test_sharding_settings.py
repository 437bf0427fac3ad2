"""The sharded strategies' settings (`prefetch`, `separate_reduce_scatter`): checked and named like every run
setting, refused where they do not apply or FSDP2 cannot do them, passed to the wrapper, and recorded in
ddp.meta's `sharding`."""

from __future__ import annotations

import pytest
import torch
from torch.distributed.fsdp import FSDPModule

from contract import GROUPS_KEY, SHARDING_FIELDS, SHARDING_KEY, dimension_of
from ddp.launch.launcher import DistContext
from ddp.strategies import registry
from ddp.strategies.torch_fsdp import TimedReduceScatter
from ddp.training import loop
from ddp.training.config import RunConfig
from profiling import record

CPU = DistContext(rank=0, local_rank=0, world_size=2, local_world_size=2, backend="gloo", device=torch.device("cpu"))


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"impl": "fsdp", "prefetch": 0}, "prefetch=0: must be a positive integer"),
        ({"impl": "fsdp", "prefetch": 2.5}, "prefetch=2.5: must be a positive integer"),
        ({"impl": "fsdp", "prefetch": True}, "prefetch=True: must be a positive integer"),
        ({"impl": "fsdp", "separate_reduce_scatter": "yes"}, "separate_reduce_scatter='yes': must be True or False"),
        ({"impl": "naive", "prefetch": 3}, "prefetch=3 applies to the sharded strategies .fsdp, torch_fsdp, hsdp, "),
        ({"impl": "hsdp", "world_size": 4, "shard_size": 3}, "shard_size=3: must divide the world size 4"),
        ({"impl": "torch_hsdp", "world_size": 4, "shard_size": 0}, "shard_size=0: must be a positive integer"),
        ({"impl": "fsdp", "world_size": 4, "shard_size": 2}, "shard_size=2 applies to hsdp, torch_hsdp, not to 'fsdp'"),
        ({"impl": "hsdp", "world_size": 4, "separate_reduce_scatter": True}, "applies to fsdp and torch_fsdp, not"),
        ({"impl": "torch", "separate_reduce_scatter": True}, "separate_reduce_scatter=True applies to the sharded"),
        ({"impl": "torch_fsdp", "prefetch": 1}, r"torch_fsdp cannot gather on demand \(prefetch=1\)"),
    ],
)
def test_a_bad_or_inapplicable_value_is_named(settings, message):
    with pytest.raises(ValueError, match=message):
        RunConfig(**settings)


def test_torch_fsdp_refuses_a_separate_reduce_scatter_group_where_fsdp2_has_no_api(monkeypatch):
    if hasattr(FSDPModule, "set_separate_reduce_scatter_group"):  # torch >= 2.13 has it: take it away
        assert RunConfig(impl="torch_fsdp", separate_reduce_scatter=True).separate_reduce_scatter
        monkeypatch.delattr(FSDPModule, "set_separate_reduce_scatter_group")
    with pytest.raises(ValueError, match="torch_fsdp cannot run its reduce-scatters on their own process group"):
        RunConfig(impl="torch_fsdp", separate_reduce_scatter=True)


def test_the_wrapper_gets_the_settings_given_and_only_those(monkeypatch):
    seen = []
    monkeypatch.setattr(registry, "wrap", lambda name, model, bucket, collective, **kw: seen.append(kw))
    loop.build_wrapped(CPU, RunConfig(impl="fsdp", model="toy", prefetch=3, separate_reduce_scatter=True))
    loop.build_wrapped(CPU, RunConfig(impl="torch_fsdp", model="toy"))
    assert seen == [{"prefetch": 3, "separate_reduce_scatter": True}, {}]


@pytest.mark.parametrize(
    "settings, expected",
    [
        ({"impl": "fsdp"}, {"prefetch": 2, "separate_reduce_scatter": False}),  # fsdp's default depth
        (
            {"impl": "fsdp", "prefetch": 1, "separate_reduce_scatter": True},
            {"prefetch": 1, "separate_reduce_scatter": True},
        ),
        ({"impl": "torch_fsdp"}, {"prefetch": None, "separate_reduce_scatter": False}),  # FSDP2's own prefetching
        ({"impl": "torch_fsdp", "prefetch": 3}, {"prefetch": 3, "separate_reduce_scatter": False}),
    ],
)
def test_ddp_meta_records_the_sharding_settings_in_effect(settings, expected):
    meta = loop.run_metadata(CPU, RunConfig(model="toy", **settings))
    assert meta[SHARDING_KEY] == expected and tuple(expected) == SHARDING_FIELDS


def test_replicated_runs_have_no_sharding_key():
    assert SHARDING_KEY not in loop.run_metadata(CPU, RunConfig(impl="overlap_bucket", model="toy"))


NO_SEPARATE_RS = pytest.mark.skipif(
    not hasattr(FSDPModule, "set_separate_reduce_scatter_group"),
    reason=f"FSDP2 of torch {torch.__version__} has no separate reduce-scatter group (RunConfig refuses it there)",
)


@pytest.mark.parametrize("impl", ["fsdp", pytest.param("torch_fsdp", marks=NO_SEPARATE_RS)])
def test_a_separate_reduce_scatter_group_is_listed_in_ddp_meta_and_named_in_its_ranges(impl):
    """ddp.meta lists the group (every rank) and the reduce-scatter ranges carry its name (contract/groups.py)."""
    meta = loop.run_metadata(CPU, RunConfig(impl=impl, model="toy", separate_reduce_scatter=True))
    assert meta[GROUPS_KEY] == {"reduce_scatter": {"ranks": [0, 1], "description": "separate reduce-scatter group"}}
    assert GROUPS_KEY not in loop.run_metadata(CPU, RunConfig(impl=impl, model="toy"))
    assert TimedReduceScatter(None, "fc1", "reduce_scatter").name == "comm:reduce_scatter:fc1@reduce_scatter"
    assert TimedReduceScatter(None, "fc1").name == "comm:reduce_scatter:fc1"


def test_run_nsys_passes_the_sharding_options_on():
    plan, _ = record.parse_args(["fsdp", "--prefetch", "3", "--separate-reduce-scatter"])
    assert plan.run_settings == {"prefetch": 3, "separate_reduce_scatter": True}
    command = plan.resolved().runner_command("fsdp")
    assert command[command.index("--prefetch") + 1] == "3" and "--separate-reduce-scatter" in command


@pytest.mark.parametrize("rank, shard, replicate", [(0, [0, 1], [0, 2]), (3, [2, 3], [1, 3])])
def test_an_hsdp_rank_lists_its_shard_and_replicate_groups_in_ddp_meta(rank, shard, replicate):
    """4 ranks, default shard size 2: shard groups of consecutive ranks, replicate groups of the same shard index."""
    ctx = DistContext(rank=rank, local_rank=rank, world_size=4, local_world_size=4, backend="gloo", device=CPU.device)
    groups = loop.run_metadata(ctx, RunConfig(impl="hsdp", model="toy", world_size=4))[GROUPS_KEY]
    assert {name: (g["ranks"], dimension_of(name, g["description"])) for name, g in groups.items()} == {
        "shard": (shard, "shard"),
        "replicate": (replicate, "replicate"),
    }


@pytest.mark.parametrize("world, expected", [(2, 2), (3, 3), (4, 2), (6, 3), (8, 4)])
def test_the_default_shard_size_is_half_the_ranks_from_four_even_ranks(world, expected):
    assert RunConfig(impl="hsdp", model="toy", world_size=world, batch_size=24 * world).resolved_shard_size == expected
