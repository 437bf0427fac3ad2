"""Every rank of one launch records the same run id in ddp.meta, and two launches record different ones:
what analysis compares to refuse merging files of different runs."""

from __future__ import annotations

import os

import pytest
import torch.distributed as dist

from contract import RUN_ID_ENV
from ddp.launch.launcher import DistContext, launch, run_id


def test_the_run_id_is_ours_else_torchruns_rendezvous_id():
    assert run_id({RUN_ID_ENV: "abc", "TORCHELASTIC_RUN_ID": "xyz"}) == "abc"
    assert run_id({"TORCHELASTIC_RUN_ID": "xyz"}) == "xyz"  # torchrun --standalone: a uuid
    assert run_id({"TORCHELASTIC_RUN_ID": "none"}) is None  # torchrun's default: says nothing
    assert run_id({}) is None


def every_ranks_run_id(ctx: DistContext) -> list:
    ids: list = [None] * ctx.world_size
    dist.all_gather_object(ids, run_id())
    return ids


@pytest.mark.ranks  # spawns two ranks, then one
def test_one_launch_one_id_two_launches_two(monkeypatch):
    monkeypatch.delenv(RUN_ID_ENV, raising=False)
    first = launch(every_ranks_run_id, 2, backend="gloo")
    second = launch(every_ranks_run_id, 1, backend="gloo")  # one rank is enough to tell another launch's id
    assert first[0] and len(set(first)) == 1 and len(set(second)) == 1 and first[0] != second[0]
    assert RUN_ID_ENV not in os.environ  # the parent's environment is left as it was
