"""Fixtures shared by the ddp tests."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from ddp.launch.launcher import free_port

# The in-process tests train toy models of a few hundred parameters: one thread computes them as fast and
# spares the spin-waiting of idle OpenMP workers on shared cores (0.6-0.9 s of CPU in the quick loop).
# Spawned ranks set their own thread count (ddp/launch/launcher.py).
torch.set_num_threads(1)


@pytest.fixture(scope="module")
def one_rank_group():
    """A 1-rank gloo group in this process: the wrappers' code paths without spawning."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()
