"""FSDP (`fsdp`): trained on 2 gloo ranks with deterministic algorithms and warnings as errors, its parameters
after every step equal single-process training bit for bit (fp32), and stay within 1e-4 of a single-process
run that casts the same way (fp16, bf16)."""

from __future__ import annotations

import pytest
import torch

from ddp.launch.launcher import launch
from tests.ddp.strategies import fsdp_cases

pytestmark = pytest.mark.slow  # every test reads the runs of spawned ranks (module fixture)

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
    ("mixed", "sgd", "prefetch1"): {
        "impl": "fsdp",
        "model": "mixed",
        "optimizer": "sgd",
        "steps": STEPS,
        "batch_size": BATCH,
        "kwargs": {"prefetch": 1},
    },
}


@pytest.fixture(scope="module")
def runs() -> dict:
    keys = list(CASES)
    outcomes = launch(fsdp_cases.sharded_worker, WORLD, [CASES[k] for k in keys], timeout_s=240)
    return dict(zip(keys, outcomes, strict=True))


def _reference(key: tuple, threads: int) -> list[dict[str, torch.Tensor]]:
    model, opt, dtype = key
    return fsdp_cases.train_reference(model, opt, STEPS, BATCH, WORLD, DTYPES.get(dtype), threads)


@pytest.mark.parametrize("key", [k for k in CASES if k[2] in ("fp32", "prefetch1")], ids="-".join)
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
