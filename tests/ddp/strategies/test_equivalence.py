"""Every implementation trains exactly like one process on the whole batch (2 and 3 gloo ranks)."""

from __future__ import annotations

import pytest
import torch

from ddp.launch.launcher import launch
from ddp.strategies.registry import HYBRID, IMPLEMENTATIONS, REPLICATED, SHARDED
from tests.ddp import cases

pytestmark = pytest.mark.ranks  # every test reads the runs of 2 and 3 spawned ranks (module fixtures)

STEPS = 3
# hsdp, torch_hsdp: tests/ddp/strategies/test_hsdp.py (on these 2 ranks they are fsdp, torch_fsdp on one replica)
IMPLS = [name for name in IMPLEMENTATIONS if name not in HYBRID]
NEEDS_UNUSED_SEARCH = {"torch": {"find_unused_parameters": True}}  # plain DDP requires every param used
BUCKET_SIZES = {  # toy gradients in reverse order: 16, 512, 128, 4096, 128, 2048 bytes
    "one_bucket": (None, 1),
    "two_buckets": (5000 / 2**20, 2),
    "many_buckets": (600 / 2**20, 5),
}


def _case(impl, model, optimizer, batch_size, **extra):
    kwargs = NEEDS_UNUSED_SEARCH.get(impl, {}) if model in ("unused", "partial") else {}
    return {
        "impl": impl,
        "model": model,
        "optimizer": optimizer,
        "steps": STEPS,
        "batch_size": batch_size,
        "kwargs": kwargs,
        **extra,
    }


# FSDP's rule (PyTorch's too): every rank runs the same modules, so `partial` (a branch some ranks skip)
# is for the replicated strategies only.
RANK_DEPENDENT = {"partial"}


def _models(impl: str, models) -> list[str]:
    return [m for m in models if impl not in SHARDED or m not in RANK_DEPENDENT]


TWO_RANK_CASES = {
    (impl, model, opt): _case(impl, model, opt, 8)
    for impl in IMPLS
    for model in _models(impl, cases.MODELS)
    for opt in ("sgd", "adamw")
}
TWO_RANK_CASES.update(
    {
        ("overlap_bucket", f"{model}-{name}", "sgd"): _case("overlap_bucket", model, "sgd", 8, bucket_mb=mb)
        for name, (mb, _) in BUCKET_SIZES.items()
        for model in ("toy", "partial", "reordered")
    }
)
THREE_RANK_CASES = {
    (impl, model, "sgd"): _case(impl, model, "sgd", 6) for impl in IMPLS for model in _models(impl, ("toy", "partial"))
}


@pytest.fixture(scope="module")
def two_ranks() -> dict:
    keys = list(TWO_RANK_CASES)
    return dict(zip(keys, launch(cases.cases_worker, 2, [TWO_RANK_CASES[k] for k in keys], timeout_s=120), strict=True))


@pytest.fixture(scope="module")
def three_ranks() -> dict:
    keys = list(THREE_RANK_CASES)
    return dict(
        zip(keys, launch(cases.cases_worker, 3, [THREE_RANK_CASES[k] for k in keys], timeout_s=120), strict=True)
    )


def _assert_matches_reference(outcome: dict, case: dict) -> None:
    reference = cases.train_reference(case["model"], case["optimizer"], case["steps"], case["batch_size"])
    assert outcome["params"].keys() == reference.keys()
    for name, ref in reference.items():
        assert torch.allclose(outcome["params"][name], ref), (
            f"{name}: max |diff| {float((outcome['params'][name] - ref).abs().max()):.3g}"
        )
    assert outcome["final_spread"] == 0.0, "ranks ended with different parameters"


@pytest.mark.parametrize("key", list(TWO_RANK_CASES), ids=lambda k: "-".join(k))
def test_two_ranks_match_single_process(two_ranks, key):
    _assert_matches_reference(two_ranks[key], TWO_RANK_CASES[key])


@pytest.mark.parametrize("key", list(THREE_RANK_CASES), ids=lambda k: "-".join(k))
def test_three_ranks_match_single_process(three_ranks, key):
    _assert_matches_reference(three_ranks[key], THREE_RANK_CASES[key])


@pytest.mark.parametrize("impl", IMPLS)
def test_construction_broadcasts_rank0_parameters_and_buffers(two_ranks, impl):
    outcome = two_ranks[(impl, "buffered", "sgd")]
    assert outcome["init_spread"] == 0.0
    # rank 0 was built from seed 0, the reference's seed: training from it reproduces the reference
    _assert_matches_reference(outcome, TWO_RANK_CASES[(impl, "buffered", "sgd")])


@pytest.mark.parametrize("impl", IMPLS)
def test_parameter_no_rank_used_keeps_no_gradient(two_ranks, impl):
    outcome = two_ranks[(impl, "unused", "adamw")]
    assert outcome["grad_is_none"]["spare.weight"] and outcome["grad_is_none"]["spare.bias"]
    assert not outcome["grad_is_none"]["fc1.weight"]


@pytest.mark.parametrize("impl", IMPLS)
def test_frozen_parameters_are_untouched(two_ranks, impl):
    outcome = two_ranks[(impl, "frozen", "adamw")]
    assert outcome["grad_is_none"]["fc1.weight"]
    assert torch.equal(outcome["params"]["fc1.weight"], cases.build("frozen", seed=0).fc1.weight)


def test_tied_parameter_is_listed_once(two_ranks):
    naive = two_ranks[("naive", "tied", "sgd")]
    assert "again.weight" not in naive["params"]  # one Parameter, synchronised under its first name
    assert naive["ops"] == [6] * STEPS  # fc1, fc2, fc3 weights and biases: one all-reduce each


@pytest.mark.parametrize("name", list(BUCKET_SIZES))
def test_bucket_sizes_give_expected_bucket_counts(two_ranks, name):
    outcome = two_ranks[("overlap_bucket", f"toy-{name}", "sgd")]
    assert outcome["num_buckets"] == BUCKET_SIZES[name][1]
    assert outcome["ops"] == [outcome["num_buckets"]] * STEPS


def test_collective_counts_per_step(two_ranks):
    ops = {impl: two_ranks[(impl, "toy", "sgd")]["ops"] for impl in IMPLS}
    assert ops["naive"] == ops["overlap"] == [6] * STEPS
    assert ops["flat"] == [1] * STEPS
    assert ops["overlap_bucket"] == [1] * STEPS  # 25 MiB holds the whole toy model
    assert ops["torch"] == [1] * STEPS


def test_buckets_are_rebuilt_in_the_order_gradients_arrived(two_ranks):
    """`reordered` registers head, body, stem but backward produces head's gradients first: after
    the first step the first bucket holds head's parameters, not the last-registered stem's."""
    outcome = two_ranks[("overlap_bucket", "reordered-many_buckets", "sgd")]
    first = outcome["buckets"][0]
    assert set(first) == {"head.weight", "head.bias"}, outcome["buckets"]
    assert [n for b in outcome["buckets"] for n in b][-2:] in (
        ["stem.weight", "stem.bias"],
        ["stem.bias", "stem.weight"],
    )
    _assert_matches_reference(outcome, TWO_RANK_CASES[("overlap_bucket", "reordered-many_buckets", "sgd")])


@pytest.mark.parametrize("impl", REPLICATED)  # sharded strategies: their sharded_layout (test_torch_fsdp.py)
def test_layout_covers_every_trainable_parameter_once(two_ranks, impl):
    """comm_layout (what ddp.meta records): each trainable parameter in exactly one collective."""
    outcome = two_ranks[(impl, "tied", "sgd")]
    names = [n for entry in outcome["layout"] for n in entry["params"]]
    assert sorted(names) == sorted(outcome["params"])  # tied `again.weight` is fc2.weight: not listed
    params = {n: p.numel() * 4 for n, p in outcome["params"].items()}
    flags = 0 if impl == "torch" else 4 * len(params)
    assert sum(e["bytes"] for e in outcome["layout"]) == sum(params.values()) + flags
