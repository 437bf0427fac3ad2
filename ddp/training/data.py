"""Synthetic batches, identical on every rank for a given (seed, step), split across ranks."""

from __future__ import annotations

import torch

from ddp.training.models import TOY_CLASSES, TOY_FEATURES, VOCAB_SIZE


def check_divisible(batch_size: int, world_size: int) -> None:
    """ValueError naming the valid sizes when the global batch cannot be split evenly."""
    if batch_size < 1 or batch_size % world_size:
        valid = ", ".join(str(world_size * k) for k in range(1, 4))
        raise ValueError(f"batch size {batch_size} is not divisible by world size {world_size}: use {valid}, ...")


def global_batch(
    model: str, step: int, batch_size: int, context_length: int, seed: int = 0, vocab_size: int = VOCAB_SIZE
) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets) of the whole global batch for `step`: features/classes for toy, tokens otherwise."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
    if model == "toy":
        return (
            torch.randn(batch_size, TOY_FEATURES, generator=gen),
            torch.randint(0, TOY_CLASSES, (batch_size,), generator=gen),
        )
    tokens = torch.randint(0, vocab_size, (batch_size, context_length + 1), generator=gen)
    return tokens[:, :-1], tokens[:, 1:]


def shard(batch: tuple[torch.Tensor, ...], rank: int, world_size: int) -> tuple[torch.Tensor, ...]:
    """Rank `rank`'s contiguous slice of each tensor's first dimension."""
    size = batch[0].shape[0]
    check_divisible(size, world_size)
    per_rank = size // world_size
    return tuple(t[rank * per_rank : (rank + 1) * per_rank] for t in batch)


def rank_batch(
    model: str,
    step: int,
    batch_size: int,
    context_length: int,
    rank: int,
    world_size: int,
    seed: int = 0,
    device: torch.device | str = "cpu",
) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's share of the global batch for `step`, on `device`."""
    inputs, targets = shard(global_batch(model, step, batch_size, context_length, seed), rank, world_size)
    return inputs.to(device, non_blocking=True), targets.to(device, non_blocking=True)
