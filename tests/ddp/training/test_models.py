"""Model table, Transformer behaviour, memory-based size choice."""

from __future__ import annotations

import pytest
import torch

from ddp.training.models import (
    MODEL_SIZES,
    VOCAB_SIZE,
    apply_rotary,
    build_model,
    estimated_training_bytes,
    largest_model_that_fits,
    parameter_count,
    rotary_tables,
)


def test_size_table_matches_the_issue():
    shapes = {n: (s.d_model, s.d_ff, s.num_layers, s.num_heads) for n, s in MODEL_SIZES.items()}
    assert shapes["small"] == (768, 3072, 12, 12) and shapes["medium"] == (1024, 4096, 24, 16)
    assert shapes["large"] == (1280, 5120, 36, 20) and shapes["xl"] == (1600, 6400, 48, 25)
    assert shapes["2.7B"] == (2560, 10240, 32, 32)


@pytest.mark.parametrize("name", ["toy", "tiny"])
def test_parameter_count_formula_matches_built_model(name):
    assert parameter_count(name) == sum(p.numel() for p in build_model(name).parameters())


def test_lm_shapes_untied_head_and_same_seed_same_weights():
    model = build_model("tiny", context_length=16, seed=3)
    logits = model(torch.randint(0, VOCAB_SIZE, (2, 16)))
    assert logits.shape == (2, 16, VOCAB_SIZE)
    assert model.lm_head.weight.data_ptr() != model.tok_emb.weight.data_ptr()
    assert torch.equal(build_model("tiny", 16, seed=3).lm_head.weight, model.lm_head.weight)


def test_attention_is_causal():
    model = build_model("tiny", context_length=12).eval()
    tokens = torch.randint(0, VOCAB_SIZE, (1, 12))
    changed = tokens.clone()
    changed[0, 8:] = (changed[0, 8:] + 1) % VOCAB_SIZE
    with torch.no_grad():
        a, b = model(tokens), model(changed)
    assert torch.allclose(a[:, :8], b[:, :8], atol=1e-6)
    assert not torch.allclose(a[:, 8:], b[:, 8:])


def test_rotary_rotation_preserves_norm_and_position_zero():
    cos, sin = rotary_tables(8, 5)
    x = torch.randn(1, 1, 5, 8)
    y = apply_rotary(x, cos, sin)
    assert torch.allclose(y.norm(dim=-1), x.norm(dim=-1), atol=1e-5)
    assert torch.allclose(y[..., 0, :], x[..., 0, :])


def test_longer_context_than_built_for_is_refused():
    with pytest.raises(ValueError, match="exceeds the model's max_len 8"):
        build_model("tiny", context_length=8)(torch.zeros(1, 9, dtype=torch.long))


def test_unknown_model_is_named():
    with pytest.raises(ValueError, match=r"unknown model 'huge'.*tiny"):
        build_model("huge")


def test_largest_model_that_fits_grows_with_memory():
    picks = [largest_model_that_fits(gib * 2**30, 4, 256) for gib in (1, 16, 80, 140)]
    counts = [parameter_count(p) for p in picks]
    assert counts == sorted(counts) and picks[0] == "tiny" and picks[-1] != "tiny"
    pick = picks[2]
    assert estimated_training_bytes(pick, 4, 256) <= 0.8 * 80 * 2**30
