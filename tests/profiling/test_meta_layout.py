"""ddp.meta's bucket layout is the one the measured steps ran with, even after one warm-up step.

PyTorch DDP rebuilds its buckets in its second step from the first step's gradient order; a layout
read when the measured steps start (after one warm-up step) was the first step's, so the what-if
refused the recording ("no bucket layout in ddp.meta for bucket1 ..."). One rank in this process,
the ranges sent to a recorder instead of NVTX.
"""

from __future__ import annotations

import contextlib
import json

import pytest
import torch
import torch.distributed as dist

from contract import META_KEY
from ddp.comm import nvtx_ranges
from ddp.launch.launcher import DistContext, free_port
from ddp.training.config import RunConfig
from ddp.training.loop import run_training
from profiling.capture import measured_region

ONE_RANK = DistContext(
    rank=0, local_rank=0, world_size=1, local_world_size=1, backend="gloo", device=torch.device("cpu")
)


class Names:
    """Records every range, start/end range and mark by name, in order."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def range(self, name: str, payload: int | None) -> contextlib.AbstractContextManager:
        self.names.append(name)
        return contextlib.nullcontext()

    def start(self, name: str, payload: int | None) -> object:
        self.names.append(name)
        return None

    def end(self, range_id: object) -> None:
        pass

    def mark(self, text: str) -> None:
        self.names.append(text)


@pytest.fixture
def one_rank_group():
    """A 1-rank gloo group in this process."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.fixture
def recorded():
    names = Names()
    nvtx_ranges.record_with(names)
    yield names
    nvtx_ranges.record_with(None)


def test_torch_ddp_meta_names_the_buckets_of_the_measured_steps(one_rank_group, recorded):
    cfg = RunConfig(impl="torch", model="tiny", world_size=1, batch_size=8, steps=2, warmup=1, bucket_mb=1)
    run_training(ONE_RANK, cfg, lambda model, memory: measured_region({"rank": 0}, model, memory))
    names = recorded.names
    metas = [json.loads(n.split(" ", 1)[1]) for n in names if n.startswith(META_KEY + " ")]
    assert len(metas) == 1
    last_step = max(i for i, n in enumerate(names) if n.startswith("step "))
    issued = [n.removeprefix("comm:all_reduce:") for n in names[last_step:] if n.startswith("comm:all_reduce:")]
    first_step = min(i for i, n in enumerate(names) if n.startswith("step "))
    before = [n for n in names[:first_step] if n.startswith("comm:all_reduce:")]
    assert len(issued) > 1 and len(before) != len(issued)  # the rebuild changed the layout: the case in point
    assert sorted(b["name"] for b in metas[0]["buckets"]) == sorted(issued)
