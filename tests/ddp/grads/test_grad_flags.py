"""The "had a gradient" protocol (ddp.grads.grad_flags) on its own, in one process: flags written,
parameters dropped only when no rank had a gradient, and (in steady-state steps of every wrapper)
nothing read back to the host and every gradient left where it is."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ddp.grads.grad_flags import FlagCarrier, GradFlags, carrier_last_order


def _params(*sizes: int) -> list[nn.Parameter]:
    return [nn.Parameter(torch.ones(n)) for n in sizes]


def test_appended_flags_are_a_view_after_the_gradients() -> None:
    params = _params(3, 2)
    buffer, flags = GradFlags.appended(5, params, like=params[0])
    assert buffer.shape == (7,) and flags.flags.data_ptr() == buffer[5:].data_ptr()


def test_write_sets_one_per_present_gradient_and_zero_per_missing() -> None:
    params = _params(3, 2, 4)
    params[0].grad, params[2].grad = torch.ones(3), torch.ones(4)
    _, flags = GradFlags.appended(0, params, like=params[0])
    flags.write_present()
    assert flags.flags.tolist() == [1.0, 0.0, 1.0]
    assert flags.grad_or_zeros(1).tolist() == [0.0, 0.0] and flags.had == [True, False, True]


def test_drop_unused_resets_only_parameters_no_rank_had() -> None:
    params = _params(2, 2, 2)
    _, flags = GradFlags.appended(0, params, like=params[0])
    flags.mark(0)
    for k in range(3):
        flags.grad_or_zeros(k)
    flags.flags.copy_(torch.tensor([2.0, 1.0, 0.0]))  # summed over ranks: another rank had parameter 1
    flags.drop_unused()
    assert [p.grad is None for p in params] == [False, False, True]


def test_a_parameter_with_a_local_gradient_is_never_dropped() -> None:
    params = _params(2, 2)
    _, flags = GradFlags.appended(0, params, like=params[0])
    for k in range(2):
        flags.mark(k)
        flags.grad_or_zeros(k)
    flags.flags.zero_()  # a count of 0 drops only parameters without a local gradient
    flags.drop_unused()
    assert all(p.grad is not None for p in params)
    flags.clear()
    assert flags.had == [False, False]


def test_flag_count_must_match_parameters() -> None:
    with pytest.raises(ValueError, match="2 flags for 3 parameters"):
        GradFlags(_params(1, 1, 1), torch.zeros(2))


def test_carrier_is_the_smallest_parameter_and_goes_last() -> None:
    params = _params(5, 1, 3, 4)
    assert carrier_last_order(params) == [3, 2, 0, 1]
    carrier = FlagCarrier(params)
    assert carrier.index == 1 and carrier.buffer.numel() == 1 + 4
    layout = carrier.layout(["a", "b", "c", "d"])
    assert [e["name"] for e in layout] == ["d", "c", "a", "b"]
    assert [e["bytes"] for e in layout] == [16, 12, 20, 20]  # the carrier: its 1 element + 4 flags


def test_carrier_packs_its_gradient_and_unpacks_the_sum() -> None:
    params = _params(3, 2)
    carrier = FlagCarrier(params)
    params[1].grad = torch.tensor([1.0, 2.0])
    packed = carrier.pack()
    assert packed[:2].tolist() == [1.0, 2.0]
    packed[:2] *= 3  # as if summed over three ranks
    assert carrier.unpack() is params[1].grad and params[1].grad.tolist() == [3.0, 6.0]


def test_carrier_needs_a_parameter() -> None:
    with pytest.raises(ValueError, match="at least one parameter"):
        FlagCarrier([])


@pytest.mark.parametrize("impl", ["naive", "flat", "overlap", "overlap_bucket"])
def test_steady_state_steps_read_no_flags_and_keep_gradients_in_place(one_rank_group, monkeypatch, impl) -> None:
    """Every parameter has a gradient: after the first step no flag is read back to the host (no
    `tolist`), and each gradient stays the same tensor (for overlap_bucket: its bucket's view)."""
    from ddp.strategies import registry

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    wrapper = registry.wrap(impl, model, bucket_size_mb=None)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(4, 8)

    def step() -> None:
        opt.zero_grad(set_to_none=False)
        wrapper(x).sum().backward()
        wrapper.finish_gradient_synchronization()
        opt.step()

    step()  # the first step (overlap_bucket: rebuilds its buckets from the arrival order, once)
    grads = [p.grad for p in model.parameters()]
    reads: list[torch.Tensor] = []
    real_tolist = torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "tolist", lambda self: reads.append(self) or real_tolist(self))
    for _ in range(3):
        step()
    assert reads == []
    assert all(p.grad is g for p, g in zip(model.parameters(), grads, strict=True))
    for bucket in getattr(wrapper, "buckets", []):
        assert all(p.grad is view for p, view in zip(bucket.params, bucket.views, strict=True))
