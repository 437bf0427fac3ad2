"""Registry lookups and RunConfig validation name the bad value and the valid choices."""

from __future__ import annotations

import pytest

from ddp import FSDP, HSDP, FlatDDP, NaiveDDP, OverlapBucketDDP, OverlapDDP, TorchDDP, TorchFSDP, TorchHSDP
from ddp.strategies import registry
from ddp.training.config import RunConfig


def test_registry_names_map_to_the_exported_classes():
    assert {name: registry.get(name) for name in registry.IMPLEMENTATIONS} == {
        "naive": NaiveDDP,
        "flat": FlatDDP,
        "overlap": OverlapDDP,
        "overlap_bucket": OverlapBucketDDP,
        "torch": TorchDDP,
        "fsdp": FSDP,
        "torch_fsdp": TorchFSDP,
        "hsdp": HSDP,
        "torch_hsdp": TorchHSDP,
    }


def test_unknown_implementation_lists_choices():
    with pytest.raises(
        ValueError,
        match="unknown implementation 'fast': choose from naive, flat, overlap, overlap_bucket, torch, fsdp, "
        "torch_fsdp, hsdp, torch_hsdp",
    ):
        registry.get("fast")
    with pytest.raises(ValueError, match="unknown implementation"):
        registry.resolve(["flat", "fast"])


def test_resolve_expands_all_in_registry_order():
    assert registry.resolve(["all"]) == list(registry.IMPLEMENTATIONS)
    assert registry.resolve(["torch", "naive", "torch"]) == ["naive", "torch"]


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("batch_size", 5, "batch size 5 is not divisible by world size 2"),
        ("impl", "nope", "unknown implementation 'nope'"),
        ("model", "nope", "unknown model 'nope'"),
        ("steps", 0, "steps=0: must be a positive integer"),
        ("bucket_mb", -1.0, "bucket_mb=-1.0: must be positive"),
        ("optimizer", "lion", "unknown optimizer 'lion'"),
        ("collective", "carrier-pigeon", "unknown collective 'carrier-pigeon'"),
    ],
)
def test_run_config_rejects_bad_values(field, value, message):
    with pytest.raises(ValueError, match=message):
        RunConfig(**{field: value})


def test_wrappers_need_an_initialised_process_group():
    import torch

    with pytest.raises(RuntimeError, match=r"needs torch\.distributed initialised"):
        NaiveDDP(torch.nn.Linear(2, 2))


@pytest.mark.parametrize("impl", ["overlap", "overlap_bucket"])
def test_second_backward_before_sync_is_a_clear_error(one_rank_group, impl):
    import torch

    from ddp.training.loop import loss_fn
    from tests.ddp import cases

    model = registry.wrap(impl, cases.build("toy", 0))
    x, y = cases.batch(0, 4)
    loss_fn(model(x), y).backward()
    with pytest.raises(RuntimeError, match="arrived twice before finish_gradient_synchronization"):
        loss_fn(model(x), y).backward()
    assert torch.is_tensor(model.module.fc1.weight.grad)


@pytest.mark.parametrize("impl", list(registry.IMPLEMENTATIONS))
def test_kept_zero_gradient_of_an_unused_parameter_stays_a_tensor(one_rank_group, impl):
    """With zero_grad(set_to_none=False) an unused parameter holds zeros, not None; every wrapper keeps
    it so (as single-process training does), so the optimizer still updates it (weight decay, moments)."""
    import torch

    from ddp.memory.accounting import local
    from tests.ddp import cases

    model = registry.wrap(impl, cases.build("unused", 0), bucket_size_mb=5000 / 2**20)
    spare = model.module.spare.weight
    spare.grad = torch.zeros_like(spare)
    inputs, targets = cases.batch(0, 4)
    torch.nn.functional.cross_entropy(model(inputs), targets).backward()
    model.finish_gradient_synchronization()
    # torch_fsdp's gradient is a DTensor: count on its local shard (all of it on one rank; torch 2.9's DTensor
    # has no count_nonzero)
    assert spare.grad is not None and torch.count_nonzero(local(spare.grad)) == 0
