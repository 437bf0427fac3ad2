"""Record PyTorch FSDP2 (`fully_shard`) training on two CPU/gloo ranks with plain torch.profiler, or
under plain `nsys profile`: a foreign trace that carries none of this project's ranges.

It imports nothing of this project (only torch), so what it records is what any FSDP2 user's job
looks like to the analysis. The model: an Embedding, then LAYERS blocks of two Linear layers and a
LayerNorm (`layers.<i>.up`, `layers.<i>.down`, `layers.<i>.norm`); every Linear is `fully_shard`ed
on its own, then the root (which holds the embedding and the norms).

    .venv/bin/python scripts/record_torch_fsdp2.py --profiler torch -o OUT   # OUT/fsdp2.rank{0,1}.json
    nsys profile -t nvtx,osrt -o OUT/fsdp2 .venv/bin/python scripts/record_torch_fsdp2.py --profiler nvtx -o OUT

`--profiler torch`: each rank writes a Chrome trace of its CPU ops (`ProfilerStep#N` per step,
FSDP's `FSDP::*` record_function ranges, gloo's collective annotations, `record_param_comms` with
message sizes). `--profiler nvtx`: every op and record_function range becomes an NVTX range
(`torch.autograd.profiler.emit_nvtx`), which is what `nsys profile` records from PyTorch without
any annotation of one's own; the steps are `ProfilerStep#N`-named record_function ranges there too.
PyTorch's NVTX profiler exists only in CUDA builds: on a CPU build `--profiler nvtx` exits with 2 (under
nsys such a build records no PyTorch range at all; nsys 2022.4 has no `--pytorch` option either).
Prints one JSON line per rank: its step times and the sharded modules' bytes.
"""

from __future__ import annotations

import argparse
import contextlib
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
from torch.distributed.fsdp import fully_shard


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.up = nn.Linear(width, 2 * width)
        self.down = nn.Linear(2 * width, width)
        self.norm = nn.LayerNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x + self.down(torch.relu(self.up(x))))


class Model(nn.Module):
    def __init__(self, vocab: int, width: int, layers: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.layers = nn.ModuleList(Block(width) for _ in range(layers))
        self.head = nn.Linear(width, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.layers:
            x = block(x)
        return self.head(x)


def sharded_bytes(model: nn.Module) -> dict[str, int]:
    """Each fully_shard-ed Linear's full (unsharded) parameter bytes in fp32, by module name."""
    return {
        name: sum(p.numel() * 4 for p in m.parameters())
        for name, m in model.named_modules()
        if isinstance(m, nn.Linear)
    }


def _profiler(kind: str, steps: int, path: Path):
    if kind == "torch":
        # a schedule makes the profiler mark each step `ProfilerStep#N`; the first step is warm-up
        schedule = torch.profiler.schedule(wait=0, warmup=1, active=steps - 1)
        return torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU],
            schedule=schedule,
            record_shapes=True,
            on_trace_ready=lambda p: p.export_chrome_trace(str(path)),  # when the last active step ends
        )
    return torch.autograd.profiler.emit_nvtx(record_shapes=False)


def worker(rank: int, args: argparse.Namespace, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=args.world_size, timeout=_timeout())
    torch.manual_seed(0)
    model = Model(args.vocab, args.width, args.layers)
    sizes = sharded_bytes(model)
    for m in model.modules():
        if isinstance(m, nn.Linear):
            fully_shard(m)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(rank)
    times = []
    prof = _profiler(args.profiler, args.steps, args.out / f"fsdp2.rank{rank}.json")
    with prof:
        for step in range(args.steps):
            tokens = torch.randint(0, args.vocab, (args.batch, args.context), generator=gen)
            begin = time.perf_counter()
            ctx = torch.profiler.record_function(f"ProfilerStep#{step}") if args.profiler == "nvtx" else None
            with ctx or contextlib.nullcontext():
                logits = model(tokens)
                loss = nn.functional.cross_entropy(logits.flatten(0, 1), tokens.flatten())
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
            times.append((time.perf_counter() - begin) * 1e3)
            if args.profiler == "torch":
                prof.step()
    print(json.dumps({"rank": rank, "step_ms": [round(t, 3) for t in times], "sharded_bytes": sizes}), flush=True)
    dist.barrier()
    dist.destroy_process_group()


def _timeout():
    import datetime

    return datetime.timedelta(seconds=60)  # a failed rank brings the other down within a minute


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="scripts/record_torch_fsdp2.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--profiler", choices=["torch", "nvtx"], default="torch")
    p.add_argument("-o", "--out", type=Path, required=True, help="output folder (created)")
    p.add_argument("--steps", type=int, default=5, help="steps; torch.profiler records all but the first")
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--vocab", type=int, default=128)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--context", type=int, default=32)
    p.add_argument("--world-size", type=int, default=2)
    args = p.parse_args(argv)
    if args.steps < 2 or args.layers < 1 or args.world_size < 2:
        print("error: --steps must be >= 2, --layers >= 1, --world-size >= 2", file=sys.stderr)
        return 2
    if args.profiler == "nvtx" and not torch.cuda.is_available():
        # PyTorch's NVTX profiler exists only in CUDA builds: under nsys a CPU build records no PyTorch range
        print("error: --profiler nvtx needs a CUDA build of PyTorch (this one cannot emit NVTX)", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    mp.start_processes(worker, args=(args, free_port()), nprocs=args.world_size, start_method="spawn")
    return 0


if __name__ == "__main__":
    sys.exit(main())
