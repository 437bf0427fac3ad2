"""torch_fsdp (PyTorch's FSDP2 behind the wrappers' interface): trains bit for bit as torch DDP does, emits
one contract range per collective whose payload is what `sharded_layout` (ddp.meta) says, and with a
compute dtype stays within 1e-4 of one process casting the same way."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule

from ddp import TorchFSDP
from ddp.launch.launcher import launch
from ddp.strategies.torch_fsdp import ROOT_UNIT, padded_numel, set_prefetch_lists, unit_modules
from tests.ddp import cases
from tests.ddp.strategies import torch_fsdp_cases

# FSDP2's separate reduce-scatter group is new in torch 2.13 (torch_fsdp refuses it before: test_sharding_settings)
SEPARATE_RS = hasattr(FSDPModule, "set_separate_reduce_scatter_group")

MODELS = ["toy", "tied", "frozen", "unused", "buffered", "reordered"]


# ---- no process group needed ----------------------------------------------------------------------
def test_padded_numel_pads_dim0_to_a_multiple_of_the_world():
    assert padded_numel(torch.Size([33, 16]), 2) == 34 * 16
    assert padded_numel(torch.Size([32, 16]), 2) == 32 * 16
    assert padded_numel(torch.Size([4]), 3) == 6
    assert padded_numel(torch.Size([1]), 4) == 4


def test_modules_sharing_a_parameter_are_left_to_the_root_unit():
    class TiedHead(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.mid, self.head = nn.Embedding(10, 8), nn.Linear(8, 8), nn.Linear(8, 10, bias=False)
            self.head.weight = self.emb.weight  # one parameter, two modules

    assert [name for name, _ in unit_modules(TiedHead(), (nn.Linear, nn.Embedding))] == ["mid"]
    assert [name for name, _ in unit_modules(TiedHead(), lambda m: isinstance(m, nn.Linear))] == ["mid"]


def test_needs_a_process_group():
    with pytest.raises(RuntimeError, match=r"needs torch\.distributed initialised"):
        TorchFSDP(nn.Linear(2, 2))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"collective": "ring"}, "collective must be 'torch', got 'ring'"),
        ({"compute_dtype": torch.int8}, "compute_dtype must be None, torch.float16 or torch.bfloat16, got torch.int8"),
        ({"shard": "Linear"}, "shard must be a tuple of module types or a predicate, got 'Linear'"),
    ],
)
def test_bad_arguments_are_named(one_rank_group, kwargs, message):
    with pytest.raises(ValueError, match=message):
        TorchFSDP(cases.build("toy", 0), **kwargs)


def test_one_rank_keeps_full_parameters_under_their_names(one_rank_group):
    module = cases.build("tied", 0)
    expected = {n: p.detach().clone() for n, p in module.named_parameters()}
    model = TorchFSDP(module)
    full = model.gather_full_params()
    assert full.keys() == expected.keys()  # `again` is fc2: listed once, as single-process training does
    assert all(torch.equal(full[n], v) for n, v in expected.items())
    assert [e["name"] for e in model.sharded_layout()] == ["fc1", "fc2", "fc3"]
    assert model.comm_layout() == []  # no all-reduce


def test_prefetch_depth_n_lists_the_next_n_minus_1_units_each_way():
    class Unit:
        def set_modules_to_forward_prefetch(self, modules):
            self.forward = modules

        def set_modules_to_backward_prefetch(self, modules):
            self.backward = modules

    units = [Unit() for _ in range(4)]
    set_prefetch_lists(units, 3)
    assert [u.forward for u in units] == [units[1:3], units[2:4], units[3:4], []]
    assert [u.backward for u in units] == [[], [units[0]], [units[1], units[0]], [units[2], units[1]]]
    set_prefetch_lists(units, 2)  # fsdp's default depth: FSDP2's default overlap, made explicit
    assert [u.forward for u in units] == [[units[1]], [units[2]], [units[3]], []]


def test_what_fsdp2_cannot_do_is_refused_before_any_collective():
    with pytest.raises(ValueError, match=r"torch_fsdp cannot gather on demand \(prefetch=1\)"):
        TorchFSDP(nn.Linear(2, 2), prefetch=1)  # refused before it looks for a process group
    with pytest.raises(ValueError, match="prefetch=0: must be a positive integer"):
        TorchFSDP(nn.Linear(2, 2), prefetch=0)


# ---- 2 gloo ranks ---------------------------------------------------------------------------------
SETTINGS = [{"prefetch": 2}, {"prefetch": 3}, *([{"separate_reduce_scatter": True, "prefetch": 3}] * SEPARATE_RS)]
PREFETCH_RUNS = [
    {"impl": impl, "model": model, "optimizer": "adamw", "steps": 3, "batch_size": 8, "kwargs": kwargs}
    for model in ("toy", "reordered")
    for setting in SETTINGS
    for impl, kwargs in (("torch", {}), ("torch_fsdp", setting))
]
DDP_RUNS = [
    {
        "impl": impl,
        "model": model,
        "optimizer": opt,
        "steps": 3,
        "batch_size": 8,
        "kwargs": {"find_unused_parameters": True} if (impl, model) == ("torch", "unused") else {},
    }
    for model in MODELS
    for opt in ("sgd", "adamw")
    for impl in ("torch", "torch_fsdp")
]
# toy under torch_fsdp with FSDP2's defaults, with separate reduce-scatters (where this torch has them), with prefetch 3
GROUP_RUNS = [{}, {"separate_reduce_scatter": SEPARATE_RS}, {"prefetch": 3}]
PAYLOAD_RUNS = [("odd", None), ("toy", None), ("odd", torch.bfloat16)]
MIXED_RUNS = [(model, dtype, 5, 0.01) for model in ("toy", "odd") for dtype in (torch.float16, torch.bfloat16)]


@pytest.fixture(scope="module")
def two_ranks() -> dict[str, list]:
    """Every run of the module's tests on 2 ranks spawned once, by worker: cases_worker's PREFETCH_RUNS and
    DDP_RUNS, groups_worker's GROUP_RUNS, payloads_worker's PAYLOAD_RUNS, mixed_worker's MIXED_RUNS."""
    calls = {
        "prefetch": (cases.cases_worker, PREFETCH_RUNS),
        "ddp": (cases.cases_worker, DDP_RUNS),
        "groups": (torch_fsdp_cases.groups_worker, GROUP_RUNS),
        "payloads": (torch_fsdp_cases.payloads_worker, PAYLOAD_RUNS),
        "mixed": (torch_fsdp_cases.mixed_worker, MIXED_RUNS),
    }
    outcomes = launch(cases.workers_in_turn, 2, list(calls.values()), timeout_s=600)
    return dict(zip(calls, outcomes, strict=True))


@pytest.mark.ranks  # spawns 2 ranks
def test_prefetch_and_a_separate_reduce_scatter_group_still_train_bit_identically_to_torch_ddp(two_ranks):
    runs, outcomes = PREFETCH_RUNS, two_ranks["prefetch"]
    for i in range(0, len(runs), 2):
        ddp, fsdp = outcomes[i]["params"], outcomes[i + 1]["params"]
        key = (runs[i + 1]["model"], runs[i + 1]["kwargs"])
        assert fsdp.keys() == ddp.keys() and all(torch.equal(fsdp[k], ddp[k]) for k in ddp), key


@pytest.fixture(scope="module")
def group_runs(two_ranks: dict[str, list]) -> list[dict]:
    return two_ranks["groups"]


@pytest.mark.ranks  # spawns 2 ranks
def test_prefetch_3_has_the_next_two_units_gathered_when_a_unit_starts(group_runs):
    default, _, deep = group_runs
    assert default["at_forward"] == [("fc1", 1), ("fc2", 2), ("fc3", 3)]  # FSDP2 on gloo: each one at its turn
    assert deep["at_forward"] == [("fc1", 3), ("fc2", 3), ("fc3", 3)]  # fc1's pre-forward prefetched fc2 and fc3


@pytest.mark.ranks  # spawns 2 ranks
@pytest.mark.skipif(not SEPARATE_RS, reason=f"FSDP2 of torch {torch.__version__} has no separate reduce-scatter group")
def test_separate_reduce_scatter_sends_every_reduce_scatter_through_a_group_of_its_own(group_runs):
    shared, separate, _ = group_runs
    units = len(unit_modules(cases.build("toy", 0), (nn.Linear, nn.Embedding)))  # toy's root holds no parameter
    for run in (shared, separate):
        gathers = {g: n for (op, g), n in run["counts"].items() if op == "all_gather"}
        assert gathers == {run["default"]: sum(gathers.values())}  # all-gathers stay on the default group
    assert {g for op, g in shared["counts"] if op == "rs"} == {shared["default"]}
    scatters = {g: n for (op, g), n in separate["counts"].items() if op == "rs"}
    assert len(scatters) == 1 and separate["default"] not in scatters  # one other group, every reduce-scatter
    assert sum(scatters.values()) == 2 * units  # one per unit per step, none missing


@pytest.mark.ranks  # spawns 2 ranks
def test_trains_bit_identically_to_torch_ddp(two_ranks):
    """FSDP2's reduce-scatter (sum, then / 2) gives each rank's shard the same float32 mean gradient as DDP's
    all-reduce: the parameters after every optimizer's steps must be equal bit for bit, not just close."""
    runs, outcomes = DDP_RUNS, two_ranks["ddp"]
    for i in range(0, len(runs), 2):
        ddp, fsdp = outcomes[i]["params"], outcomes[i + 1]["params"]
        key = (runs[i]["model"], runs[i]["optimizer"])
        assert fsdp.keys() == ddp.keys(), key
        assert all(torch.equal(fsdp[k], ddp[k]) for k in ddp), key
        assert outcomes[i + 1]["final_spread"] == 0.0 and outcomes[i + 1]["init_spread"] == 0.0, key


@pytest.fixture(scope="module")
def payloads(two_ranks: dict[str, list]) -> dict:
    return dict(zip(PAYLOAD_RUNS, two_ranks["payloads"], strict=True))


@pytest.mark.ranks
@pytest.mark.parametrize("run", [("odd", None), ("toy", None), ("odd", torch.bfloat16)], ids=str)
def test_each_collective_is_one_contract_range_whose_payload_the_layout_states(payloads, run):
    out = payloads[run]
    layout = {e["name"]: e for e in out["layout"]}
    for ranges, (num_ops, nbytes) in zip(out["steps"], out["stats"], strict=True):
        gathers = [(n.removeprefix("comm:all_gather:"), p) for n, p in ranges if n.startswith("comm:all_gather:")]
        scatters = [
            (n.removeprefix("comm:reduce_scatter:"), p) for n, p in ranges if n.startswith("comm:reduce_scatter:")
        ]
        assert len(gathers) + len(scatters) == len(ranges) == num_ops  # nothing else, each counted once
        assert sum(p for _, p in ranges) == nbytes
        assert all(p == layout[tag]["all_gather_bytes"] for tag, p in gathers)
        assert sorted(scatters) == sorted((tag, e["reduce_scatter_bytes"]) for tag, e in layout.items())
        forward = {tag for tag, _ in gathers}
        assert forward == set(layout)  # every unit gathered (again in backward, except the root)


@pytest.mark.ranks
def test_layout_pads_and_names_units_as_fsdp2_does(payloads):
    odd = {e["name"]: e for e in payloads[("odd", None)]["layout"]}
    inp_numel = torch_fsdp_cases.ODD * (cases.FEATURES + 1)
    assert odd["inp"]["params"] == ["inp.weight", "inp.bias"] and odd["inp"]["numel"] == inp_numel
    assert odd["inp"]["padded_numel"] == 34 * (cases.FEATURES + 1)  # 33 rows padded to 34, weight and bias
    assert odd["root"]["params"] == ["norm.weight", "norm.bias"]  # what no matched module owns
    assert odd["inp"]["shard_bytes"] == 17 * (cases.FEATURES + 1) * 4
    bf16 = {e["name"]: e for e in payloads[("odd", torch.bfloat16)]["layout"]}
    assert bf16["inp"]["all_gather_bytes"] == odd["inp"]["all_gather_bytes"] // 2  # weights travel in bf16
    assert bf16["inp"]["reduce_scatter_bytes"] == odd["inp"]["reduce_scatter_bytes"]  # gradients in float32


@pytest.mark.ranks
def test_master_weights_and_gradients_stay_float32_under_a_compute_dtype(payloads):
    master = payloads[("odd", torch.bfloat16)]["master"]
    assert set(master.values()) == {("torch.float32", "torch.float32")}


@pytest.mark.ranks  # spawns 2 ranks
def test_fp16_and_bf16_stay_within_1e_4_of_one_process_casting_the_same_way(two_ranks):
    runs, outcomes = MIXED_RUNS, two_ranks["mixed"]
    for run, params in zip(runs, outcomes, strict=True):
        reference = torch_fsdp_cases.reference_mixed(*run)
        assert params.keys() == reference.keys()
        worst = max(float((params[k] - ref).abs().max()) for k, ref in reference.items())
        moved = max(
            float((ref - torch_fsdp_cases.build(run[0], 0).state_dict()[k]).abs().max()) for k, ref in reference.items()
        )
        assert worst <= 1e-4 < moved, (run, worst, moved)  # close, and not because nothing trained


@pytest.mark.ranks
@pytest.mark.parametrize("run", [("odd", None), ("toy", None), ("odd", torch.bfloat16)], ids=str)
def test_memory_parts_are_the_shards_and_the_gathered_units(payloads, run):
    out = payloads[run]
    layout, memory = out["layout"], out["memory"]
    shards = sum(e["shard_bytes"] for e in layout)
    assert memory.parameters == shards  # padded local shards; `odd` has no buffer
    assert memory.gradients == shards  # float32 gradients of every (trainable) shard
    padded = {e["name"]: e["all_gather_bytes"] for e in layout}
    assert all(size == padded.get(tag, 0) for tag, size in out["at_forward"])  # a forward sees the padded unit
    assert memory.gathered == fsdp2_gathered_peak(out["at_forward"])


def fsdp2_gathered_peak(at_forward: list[tuple[str, int]]) -> int:
    """The most bytes of full parameters FSDP2 holds at once, from each unit's unsharded parameter bytes seen at
    its forward (in forward order, the root first) and FSDP2's documented lifetimes on a synchronous (CPU)
    group: the root's parameters stay unsharded from its forward to its backward; every other unit's only
    during its forward (and again in backward); a unit's flat all-gather output has its unsharded size and
    lives until the next unit's copy-out has finished. So at unit i's copy-out FSDP2 holds the root, unit
    i-1's all-gather output and unit i twice (output and copy); backward holds less (one unit and its output,
    or one unit and the next one's prefetched output)."""
    sizes = dict(at_forward)
    root = sizes.get(ROOT_UNIT, 0)
    order = [tag for tag, _ in at_forward if tag != ROOT_UNIT]
    previous = [root, *(sizes[tag] for tag in order[:-1])]
    return root + max((before + 2 * sizes[tag] for before, tag in zip(previous, order, strict=True)), default=0)
