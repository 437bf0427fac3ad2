"""FSDP (`fsdp`): trained on 2 gloo ranks with deterministic algorithms and warnings as errors, its parameters
after every step equal single-process training bit for bit (fp32), and stay within 1e-4 of a single-process
run that casts the same way (fp16, bf16)."""

from __future__ import annotations

import pytest
import torch

from ddp.launch.launcher import launch
from ddp.sharding.gradient_buffers import KEEP
from tests.ddp import cases
from tests.ddp.strategies import fsdp_cases

pytestmark = pytest.mark.ranks  # every test reads the runs of spawned ranks (module fixture)

STEPS, BATCH, WORLD = 3, 8, 2
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
CASES = {
    **{
        (model, opt, "fp32"): {"impl": "fsdp", "model": model, "optimizer": opt, "steps": STEPS, "batch_size": BATCH}
        for model in fsdp_cases.MODELS
        for opt in ("sgd", "adamw")
    },
    **{
        ("mixed", "adamw", name): {
            "impl": "fsdp",
            "model": "mixed",
            "optimizer": "adamw",
            "steps": STEPS,
            "batch_size": BATCH,
            "kwargs": {"compute_dtype": dtype},
        }
        for name, dtype in DTYPES.items()
    },
    **{
        (model, opt, name): {
            "impl": "fsdp",
            "model": model,
            "optimizer": opt,
            "steps": STEPS,
            "batch_size": BATCH,
            "kwargs": kwargs,
        }
        for model, opt, name, kwargs in [
            ("mixed", "sgd", "prefetch1", {"prefetch": 1}),
            ("stack", "adamw", "prefetch3", {"prefetch": 3}),
            ("mixed", "adamw", "separate_rs", {"separate_reduce_scatter": True}),
            ("stack", "sgd", "separate_rs", {"separate_reduce_scatter": True, "prefetch": 3}),
        ]
    },
}
SETTINGS = ("fp32", "prefetch1", "prefetch3", "separate_rs")  # fp32 runs: bit for bit with one process


@pytest.fixture(scope="module")
def two_ranks() -> tuple[list, list, dict]:
    """The module's runs on WORLD ranks spawned once: sharded_worker's CASES, log_worker's LOG_CASES, then
    behaviours (last: it ends with a refused backward)."""
    calls = [
        (fsdp_cases.sharded_worker, list(CASES.values())),
        (fsdp_cases.log_worker, list(LOG_CASES.values())),
        (fsdp_cases.behaviours,),
    ]
    sharded, logged, behaviours = launch(cases.workers_in_turn, WORLD, calls, timeout_s=480)
    return sharded, logged, behaviours


@pytest.fixture(scope="module")
def runs(two_ranks: tuple[list, list, dict]) -> dict:
    return dict(zip(CASES, two_ranks[0], strict=True))


def _reference(key: tuple, threads: int) -> list[dict[str, torch.Tensor]]:
    model, opt, dtype = key
    return fsdp_cases.train_reference(model, opt, STEPS, BATCH, WORLD, DTYPES.get(dtype), threads)


@pytest.mark.parametrize("key", [k for k in CASES if k[2] in SETTINGS], ids="-".join)
def test_fp32_parameters_equal_single_process_bit_for_bit_after_every_step(runs, key):
    outcome = runs[key]
    reference = _reference(key, outcome["threads"])
    for step, (got, want) in enumerate(zip(outcome["history"], reference, strict=True)):
        assert got.keys() == want.keys()
        for name, value in want.items():
            assert torch.equal(got[name], value), f"step {step} {name}: {float((got[name] - value).abs().max()):.3g}"
    first = fsdp_cases.build(key[0], seed=0).state_dict()
    assert any(not torch.equal(outcome["history"][-1][n], first[n]) for n in first)  # it trained


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_low_precision_stays_within_1e4_of_a_single_process_run_that_casts_alike(runs, dtype):
    outcome = runs[("mixed", "adamw", dtype)]
    reference = _reference(("mixed", "adamw", dtype), outcome["threads"])
    for got, want in zip(outcome["history"], reference, strict=True):
        for name, value in want.items():
            assert got[name].dtype == torch.float32  # master weights stay fp32
            assert float((got[name] - value).abs().max()) <= 1e-4, name
    plain = _reference(("mixed", "adamw", "fp32"), outcome["threads"])
    assert any(not torch.equal(outcome["history"][-1][n], plain[-1][n]) for n in plain[-1])  # it did cast


def test_module_holds_one_dimensional_fp32_shards_with_matching_grads(runs):
    shards = runs[("mixed", "sgd", "fp32")]["shards"]
    whole = dict(fsdp_cases.build("mixed", 0).named_parameters())
    for name, p in whole.items():
        shape, dtype, grad = shards[name]
        assert dtype == torch.float32
        if name in ("emb.weight", "norm.weight", "norm.bias") or not p.requires_grad:  # tied, norms, frozen: whole
            assert shape == tuple(p.shape)
        else:
            assert len(shape) == 1 and shape[0] <= p.numel()  # a rank's part: all, some or none of it
        if not p.requires_grad:  # frozen: fc1.bias, frozen.*
            assert grad is None
        elif grad is not None:
            assert grad == (shape, torch.float32)
    assert shards["mid.weight"][0][0] < whole["mid.weight"].numel()  # 576 elements over 2 ranks


def test_sharded_layout_lists_each_unit_with_its_padded_bytes(runs):
    layout = runs[("mixed", "sgd", "fp32")]["layout"]
    assert [e["name"] for e in layout] == ["fc1", "mid", "fc2"]  # forward order; emb/head tied: replicated
    model = fsdp_cases.build("mixed", 0)
    for entry in layout:
        module = model.get_submodule(entry["name"])
        trainable = [p for p in module.parameters() if p.requires_grad]
        assert entry["numel"] == sum(p.numel() for p in trainable)
        assert entry["padded_numel"] % WORLD == 0 and entry["padded_numel"] >= entry["numel"]
        assert entry["all_gather_bytes"] == entry["padded_numel"] * 4


# ---- what a step communicates, in which order, and what it holds --------------------------------------
STACK_UNITS = ["emb", "layers.0", "layers.1", "layers.2", "layers.3", "head"]
LOG_CASES = {
    name: {"impl": "fsdp", "model": "stack", "optimizer": "sgd", "steps": 2, "batch_size": BATCH, "kwargs": kwargs}
    for name, kwargs in {
        "prefetch1": {"prefetch": 1},
        "prefetch2": {},
        "bf16": {"compute_dtype": torch.bfloat16},
    }.items()
}


@pytest.fixture(scope="module")
def logs(two_ranks: tuple[list, list, dict]) -> dict:
    return dict(zip(LOG_CASES, two_ranks[1], strict=True))


def _starts(events: list, prefix: str) -> list[tuple[int, str, int]]:
    return [(i, name.removeprefix(prefix), size) for i, (kind, name, size) in enumerate(events)
            if kind == "start" and name.startswith(prefix)]  # fmt: skip


@pytest.mark.parametrize("case", list(LOG_CASES))
def test_every_unit_is_gathered_twice_and_reduce_scattered_once_per_step_with_its_bytes(logs, case):
    log = logs[case]
    layout = {e["name"]: e for e in log["layout"]}
    assert list(layout) == STACK_UNITS  # forward order
    gathers, scatters = _starts(log["events"], "comm:all_gather:"), _starts(log["events"], "comm:reduce_scatter:")
    assert sorted(n for _, n, _ in gathers) == sorted(STACK_UNITS * 2)  # forward, then again in backward
    assert sorted(n for _, n, _ in scatters) == sorted(STACK_UNITS)
    wire = 2 if case == "bf16" else 4
    for _, name, size in gathers:
        assert size == layout[name]["all_gather_bytes"] == layout[name]["padded_numel"] * wire
    for _, name, size in scatters:  # gradients travel in float32 whatever the compute dtype
        assert size == layout[name]["reduce_scatter_bytes"] == layout[name]["padded_numel"] * 4
    norms = _starts(log["events"], "comm:all_reduce:")
    assert len(norms) == 8  # the LayerNorms stay replicated: one all-reduce per weight and bias
    sizes = [s for _, _, s in gathers + scatters + norms]
    assert log["ops"] == len(sizes) and log["bytes"] == sum(sizes)  # CommStats counts the same
    ended = [n for kind, n, _ in log["events"] if kind == "end"]
    assert sorted(ended) == sorted(n for kind, n, _ in log["events"] if kind == "start")  # every range closed


@pytest.mark.parametrize("case, depth", [("prefetch1", 1), ("prefetch2", 2)])
def test_a_gather_starts_once_the_unit_depth_places_before_it_is_done(logs, case, depth):
    """Forward: unit i's all-gather is issued right after unit i-depth's forward ended, before unit i-depth+1's
    forward ends; backward (reverse order): right after unit i-depth's reduce-scatter was issued."""
    events = logs[case]["events"]
    at = {(kind, name): i for i, (kind, name, _) in enumerate(events) if kind.startswith("forward")}
    gathers = _starts(events, "comm:all_gather:")
    forward, backward = gathers[: len(STACK_UNITS)], gathers[len(STACK_UNITS) :]
    assert [n for _, n, _ in forward] == STACK_UNITS and [n for _, n, _ in backward] == STACK_UNITS[::-1]
    for k, (i, name, _) in enumerate(forward):
        assert i < at[("forward_start", name)]
        if k < depth:
            assert i < at[("forward_start", STACK_UNITS[0])]
        else:
            assert at[("forward_end", STACK_UNITS[k - depth])] < i
            assert k - depth + 1 == k or i < at[("forward_end", STACK_UNITS[k - depth + 1])]
    scatter_at = {name: i for i, name, _ in _starts(events, "comm:reduce_scatter:")}
    for k, (i, name, _) in enumerate(backward):
        assert i < scatter_at[name]
        if k >= depth:
            assert scatter_at[STACK_UNITS[::-1][k - depth]] < i


@pytest.mark.parametrize("case", list(LOG_CASES))
def test_memory_parts_count_shards_and_the_gathered_high_water_mark(logs, case):
    log = logs[case]
    memory, layout = log["memory"], log["layout"]
    shards = sum(e["shard_bytes"] for e in layout)
    assert memory["parameters"] == shards + log["replicated_bytes"] + log["buffers"]
    assert memory["gradients"] == shards + log["replicated_bytes"]  # float32 grads of the shards and norms
    units = sorted((e["all_gather_bytes"] for e in layout), reverse=True)
    depth = 1 if case == "prefetch1" else 2
    assert units[0] <= memory["gathered"] <= sum(units[:depth])  # at most `prefetch` units gathered at once
    largest = max(e["padded_numel"] for e in layout) * 4  # the flat float32 gradient buffers, KEEP of them
    casts = (shards + log["replicated_bytes"]) // 2 if case == "bf16" else 0  # shards to send, norms to compute with
    assert memory["comm_buffers"] == KEEP * largest + casts


# ---- 3 ranks, and around plain training -------------------------------------------------------------------
def test_three_ranks_train_like_one_process_and_agree():
    case = {"impl": "fsdp", "model": "mixed", "optimizer": "adamw", "steps": STEPS, "batch_size": 6}
    everyone = launch(fsdp_cases.every_rank_worker, 3, [case], timeout_s=240)
    reference = fsdp_cases.train_reference("mixed", "adamw", STEPS, 6, 3, threads=everyone[0][0]["threads"])
    for rank_outcomes in everyone:
        for got, want in zip(rank_outcomes[0]["history"], reference, strict=True):
            for name, value in want.items():  # gloo may add 3 gradients in another order: close, not equal
                assert torch.allclose(got[name], value, rtol=1e-5, atol=1e-7), name
    finals = [outcomes[0]["history"][-1] for outcomes in everyone]
    assert all(torch.equal(f[n], finals[0][n]) for f in finals for n in finals[0])  # ranks agree exactly


def test_eval_forward_frees_its_gathers_and_a_second_backward_is_refused(two_ranks):
    outcome = two_ranks[2]
    assert outcome["eval_logits_shape"] == (BATCH // WORLD, 5, fsdp_cases.VOCAB)
    assert outcome["free_after_eval"]
    assert all(len(shape) == 1 for n, shape in outcome["params_after_eval"].items() if "norms" not in n)
    assert outcome["refused"]
