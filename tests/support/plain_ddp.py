"""A short PyTorch DDP training job that uses none of this project's code: someone else's job.

Two gloo ranks on the CPU (torch.multiprocessing, a free port), a small MLP, a few steps. Each rank times
its own steps with the host clock (perf_counter_ns around each whole iteration, and around
`loss.backward()`) and writes them to `<out>/timer.rank<N>.json`, the truth the trace's steps and
backward windows are checked against. The clock is time.time_ns, which torch.profiler and nsys share
on Linux (CLOCK_REALTIME is Kineto's time base; nsys records session start in it).

  --profiler torch   each rank records itself with torch.profiler (a schedule: one warm-up step, the
                     others recorded, each marked `ProfilerStep#N`) into `<out>/plain_ddp.rank<N>.json`
  --profiler none    no profiler: run it under `nsys profile` (whatever markers nsys sees are its own)

    python tests/support/plain_ddp.py --out DIR [--profiler torch|none] [--steps 6]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*(layer for _ in range(4) for layer in (nn.Linear(512, 512), nn.ReLU())), nn.Linear(512, 10))


def train(rank: int, world: int, port: int, steps: int, out: Path, profiler: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    net = DistributedDataParallel(model(), bucket_cap_mb=1)  # several buckets: all-reduces during backward
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    x, y = torch.randn(64, 512), torch.randint(0, 10, (64,))
    prof = None
    if profiler == "torch":
        path = str(out / f"plain_ddp.rank{rank}.json")
        prof = torch.profiler.profile(  # the first step warms up, the others are recorded
            activities=[torch.profiler.ProfilerActivity.CPU],
            schedule=torch.profiler.schedule(wait=0, warmup=1, active=steps - 1, repeat=1),
            on_trace_ready=lambda p: p.export_chrome_trace(path),
        )
        prof.start()
    timer: dict[str, list[int]] = {
        "step_start_ns": [],
        "step_end_ns": [],
        "backward_start_ns": [],
        "backward_end_ns": [],
        "stepped_ns": [],  # when prof.step() returned: the latest a ProfilerStep range it closed can end
    }
    for _ in range(steps):
        timer["step_start_ns"].append(time.time_ns())
        opt.zero_grad()
        loss = nn.functional.cross_entropy(net(x), y)
        timer["backward_start_ns"].append(time.time_ns())
        loss.backward()
        timer["backward_end_ns"].append(time.time_ns())
        opt.step()
        timer["step_end_ns"].append(time.time_ns())
        if prof is not None:
            prof.step()
        timer["stepped_ns"].append(time.time_ns())
    if prof is not None:
        prof.stop()
    (out / f"timer.rank{rank}.json").write_text(json.dumps(timer))
    dist.barrier()
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--profiler", choices=["torch", "none"], default="torch")
    p.add_argument("--steps", type=int, default=6)
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    # join=True: a failed rank raises here and the context terminates the other one
    mp.start_processes(
        train, args=(2, free_port(), args.steps, args.out, args.profiler), nprocs=2, start_method="spawn"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
