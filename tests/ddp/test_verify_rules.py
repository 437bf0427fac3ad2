"""ddp.verify's comparison rules, without ranks: where bit-identity with the rank-slice reference is required,
and what a row's `compared` says (the reference's device, why bit-identity was skipped)."""

from __future__ import annotations

from ddp.training.config import RunConfig
from ddp.verify import bit_identity_skipped, how_compared

H200 = "NVIDIA H200"


def _cfg(world: int = 2) -> RunConfig:
    return RunConfig(impl="fsdp", model="toy", world_size=world, batch_size=4 * world, steps=5, warmup=0)


def test_bit_identity_is_required_on_two_ranks_on_one_kind_of_device_gpu_or_cpu():
    assert bit_identity_skipped(_cfg(), "nccl", [H200, H200]) is None
    assert bit_identity_skipped(_cfg(), "gloo", ["cpu", "cpu"]) is None


def test_bit_identity_is_skipped_with_the_reason_where_the_sum_or_the_kernels_may_differ():
    assert bit_identity_skipped(_cfg(3), "nccl", [H200] * 3) == "3 ranks: nccl may add the 3 gradients in another order"
    reason = bit_identity_skipped(_cfg(), "nccl", [H200, "NVIDIA H100 80GB HBM3"])
    assert reason == f"ranks on different devices (NVIDIA H100 80GB HBM3, {H200}): kernels may round differently"


def test_compared_names_where_the_references_ran_and_why_bits_were_not_required():
    text = how_compared(_cfg(3), 1e-5, 1e-8, "cuda:0", "3 ranks: nccl may add the 3 gradients in another order")
    assert text.startswith("vs 1 process on cuda:0, sgd (allclose rtol 1e-05 atol 1e-08)")
    assert "each step vs 1 process on cuda:0 adding the 3 rank slices' gradients" in text
    assert "bit-identity skipped: 3 ranks: nccl may add the 3 gradients in another order, allclose decides" in text
    assert "skipped" not in how_compared(_cfg(), 1e-5, 1e-8, "cuda:0", None)
