"""Synthetic batches: deterministic, split evenly, clear error for an indivisible batch."""

from __future__ import annotations

import pytest
import torch

from ddp.training.data import check_divisible, global_batch, rank_batch


def test_shards_reassemble_the_global_batch():
    inputs, targets = global_batch("tiny", step=2, batch_size=6, context_length=5, seed=1)
    parts = [rank_batch("tiny", 2, 6, 5, rank, 3, seed=1) for rank in range(3)]
    assert torch.equal(torch.cat([p[0] for p in parts]), inputs)
    assert torch.equal(torch.cat([p[1] for p in parts]), targets)
    assert torch.equal(inputs[:, 1:], targets[:, :-1])  # next-token targets


def test_batches_depend_on_step_and_seed_only():
    a, _ = global_batch("toy", 0, 4, 1, seed=0)
    assert torch.equal(a, global_batch("toy", 0, 4, 1, seed=0)[0])
    assert not torch.equal(a, global_batch("toy", 1, 4, 1, seed=0)[0])
    assert not torch.equal(a, global_batch("toy", 0, 4, 1, seed=1)[0])


def test_indivisible_batch_names_valid_sizes():
    with pytest.raises(ValueError, match=r"batch size 5 is not divisible by world size 2: use 2, 4, 6, \.\.\."):
        check_divisible(5, 2)
    with pytest.raises(ValueError, match="not divisible by world size 3: use 3, 6, 9"):
        rank_batch("toy", 0, 4, 1, rank=0, world_size=3)
