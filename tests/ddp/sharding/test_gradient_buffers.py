"""fsdp's shared flat gradient buffers (ddp/sharding/gradient_buffers.py): allocated up to `keep`, then reused
once the owner's `reclaim` has freed one (its reduce-scatter waited for), more only when none can be."""

from __future__ import annotations

import pytest
import torch

from ddp.sharding.gradient_buffers import GradientBuffers


class Owner:
    """Stands in for fsdp: the units holding a buffer whose reduce-scatter is in flight, oldest first."""

    def __init__(self):
        self.in_flight: list[str] = []
        self.buffers: GradientBuffers | None = None
        self.reclaimed: list[str] = []

    def reclaim(self) -> bool:
        if not self.in_flight:
            return False
        unit = self.in_flight.pop(0)
        assert self.buffers is not None
        self.buffers.give_back(unit)
        self.reclaimed.append(unit)
        return True


def make(keep: int = 2) -> tuple[GradientBuffers, Owner]:
    owner = Owner()
    owner.buffers = GradientBuffers(128, torch.float32, torch.device("cpu"), owner.reclaim, keep=keep)
    return owner.buffers, owner


def test_units_in_turn_share_keep_buffers_reclaiming_the_oldest_reduce_scatter():
    buffers, owner = make()
    addresses = []
    for unit in ["head", "l3", "l2", "l1", "l0"]:  # backward order: each unit's reduce-scatter is issued at once
        addresses.append(buffers.take(unit).data_ptr())
        owner.in_flight.append(unit)
    assert len(buffers.buffers) == 2 and buffers.buffers[0].numel() == 128
    assert addresses == [addresses[0], addresses[1]] * 2 + [addresses[0]]  # reused alternately
    assert owner.reclaimed == ["head", "l3", "l2"]  # the oldest first, only when both were taken


def test_a_buffer_given_back_is_taken_without_waiting():
    buffers, owner = make()
    first = buffers.take("a")
    buffers.take("b")
    buffers.give_back("a")  # its reduce-scatter was seen complete
    assert buffers.take("c") is first and owner.reclaimed == []


def test_one_more_is_allocated_only_when_every_buffer_still_accumulates():
    buffers, owner = make()
    buffers.take("a")
    buffers.take("b")  # neither has issued its reduce-scatter: nothing to reclaim
    buffers.take("c")
    assert len(buffers.buffers) == 3 and owner.reclaimed == []


def test_giving_back_a_buffer_never_taken_is_an_error():
    buffers, _ = make()
    with pytest.raises(AssertionError):
        buffers.give_back("nobody")
