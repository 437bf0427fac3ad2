"""Models and rank workers for the multi-process tests (module level: spawned ranks import them)."""

from __future__ import annotations

import os
import time
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ddp.launch.launcher import DistContext
from ddp.strategies import registry
from ddp.strategies.base import DataParallelBase
from ddp.training.data import shard
from ddp.training.loop import make_optimizer, train_step

FEATURES, HIDDEN, CLASSES = 16, 32, 4


class Toy(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(FEATURES, HIDDEN), nn.Linear(HIDDEN, HIDDEN)
        self.fc3 = nn.Linear(HIDDEN, CLASSES)

    def forward(self, x):
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


class Tied(Toy):
    """fc2 is registered a second time as `again` and applied twice: one parameter, two names."""

    def __init__(self):
        super().__init__()
        self.again = self.fc2

    def forward(self, x):
        return self.fc3(F.relu(self.again(F.relu(self.fc2(F.relu(self.fc1(x)))))))


class Frozen(Toy):
    def __init__(self):
        super().__init__()
        self.fc1.requires_grad_(False)


class Unused(Toy):
    """`spare` never takes part in forward: no rank ever has a gradient for it."""

    def __init__(self):
        super().__init__()
        self.spare = nn.Linear(HIDDEN, HIDDEN)


class Partial(Toy):
    """`branch` runs only on rows whose first feature is positive: some ranks never call it."""

    def __init__(self):
        super().__init__()
        self.branch = nn.Linear(HIDDEN, HIDDEN)

    def forward(self, x):
        h = F.relu(self.fc1(x))
        mask = x[:, 0] > 0
        if bool(mask.any()):
            h = h + mask[:, None] * self.branch(h)
        return self.fc3(F.relu(self.fc2(h)))


class Buffered(Toy):
    """A buffer drawn from the seed: differs between ranks until the wrapper broadcasts it."""

    def __init__(self):
        super().__init__()
        self.register_buffer("gain", 1 + 0.1 * torch.randn(HIDDEN))

    def forward(self, x):
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)) * self.gain)))


class Reordered(nn.Module):
    """Layers registered in the reverse of their use: backward's gradient order is not the reverse
    registration order that OverlapBucketDDP's first step assumes."""

    def __init__(self):
        super().__init__()
        self.head = nn.Linear(HIDDEN, CLASSES)
        self.body = nn.Linear(HIDDEN, HIDDEN)
        self.stem = nn.Linear(FEATURES, HIDDEN)

    def forward(self, x):
        return self.head(F.relu(self.body(F.relu(self.stem(x)))))


MODELS = {
    "toy": Toy,
    "tied": Tied,
    "frozen": Frozen,
    "unused": Unused,
    "partial": Partial,
    "buffered": Buffered,
    "reordered": Reordered,
}
LR = {"sgd": 0.5, "adamw": 0.01}


def build(model: str, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return MODELS[model]()


def batch(step: int, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Global batch; the first half of its rows (rank 0's shard) set the `Partial` branch flag."""
    gen = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(batch_size, FEATURES, generator=gen)
    x[:, 0] = torch.where(torch.arange(batch_size) < batch_size // 2, 1.0, -1.0)
    return x, torch.randint(0, CLASSES, (batch_size,), generator=gen)


def train_reference(model: str, optimizer: str, steps: int, batch_size: int) -> dict[str, torch.Tensor]:
    """Single-process training on whole global batches, written independently of ddp.training.loop."""
    net = build(model, seed=0)
    opt = (
        torch.optim.SGD(net.parameters(), lr=LR["sgd"])
        if optimizer == "sgd"
        else torch.optim.AdamW(net.parameters(), lr=LR["adamw"], weight_decay=0.01)
    )
    for step in range(steps):
        x, y = batch(step, batch_size)
        opt.zero_grad()
        F.cross_entropy(net(x), y).backward()
        opt.step()
    return {k: v.detach().clone() for k, v in net.named_parameters()}


def _spread(wrapper: DataParallelBase) -> float:
    """Largest difference between this rank's parameters (in full) + buffers and any other rank's."""
    full = [*wrapper.gather_full_params().values(), *wrapper.module.buffers()]
    flat = torch.cat([t.detach().reshape(-1) for t in full])
    everyone = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, flat)
    return max(float((o - flat).abs().max()) for o in everyone)


def run_case(ctx: DistContext, case: dict) -> dict:
    """Train one case from a rank-specific init; what the tests check about it."""
    module = build(case["model"], seed=ctx.rank)  # different on every rank until broadcast
    wrapper = registry.wrap(case["impl"], module, case.get("bucket_mb", 25), **case.get("kwargs", {}))
    init_spread = _spread(wrapper)
    opt = make_optimizer(case["optimizer"], module.parameters(), LR[case["optimizer"]], case.get("shard", False))
    ops = []
    for step in range(case["steps"]):
        local = shard(batch(step, case["batch_size"]), ctx.rank, ctx.world_size)
        train_step(wrapper, opt, local, step)
        ops.append(wrapper.reset_comm_stats().num_ops)
    return {
        "params": wrapper.gather_full_params(),
        "grad_is_none": {k: v.grad is None for k, v in module.named_parameters()},
        "init_spread": init_spread,
        "final_spread": _spread(wrapper),
        "ops": ops,
        "num_buckets": len(getattr(wrapper, "buckets", [])),
        "buckets": [list(b.names) for b in getattr(wrapper, "buckets", [])],
        "layout": wrapper.comm_layout(),
    }


def cases_worker(ctx: DistContext, cases: list[dict]) -> list[dict]:
    return [run_case(ctx, case) for case in cases]


def workers_in_turn(ctx: DistContext, calls: list[tuple]) -> list:
    """`worker(ctx, *args)` of each (worker, *args) in `calls`, one after another on the same ranks: a test
    module's runs on ranks spawned once (spawning imports torch on every rank, seconds of CPU each). The
    process-wide settings a worker may change (warning filters, deterministic algorithms) are put back
    after it, as a fresh rank would have them."""
    out = []
    for worker, *args in calls:
        deterministic = torch.are_deterministic_algorithms_enabled()
        with warnings.catch_warnings():
            out.append(worker(ctx, *args))
        torch.use_deterministic_algorithms(deterministic)
    return out


def raise_on_rank1(ctx: DistContext) -> None:
    if ctx.rank == 1:
        raise ValueError("boom on purpose")
    dist.barrier()  # rank 0 waits on a peer that is gone


def exit_on_rank1(ctx: DistContext) -> None:
    if ctx.rank == 1:
        os._exit(3)
    dist.barrier()


def sleep_forever(ctx: DistContext, folder: str) -> None:
    """Say in `folder` that this rank is running, then sleep."""
    (Path(folder) / f"rank{ctx.rank}").touch()
    time.sleep(3600)


def report_context(ctx: DistContext) -> dict:
    return {
        "rank": ctx.rank,
        "world_size": ctx.world_size,
        "backend": ctx.backend,
        "threads": torch.get_num_threads(),
        "device": str(ctx.device),
    }


def async_range_end_threads(ctx: DistContext) -> dict[str, str]:
    """One overlap step on the tiny LM with NVTX recorded: each async range's name -> ending thread."""
    import threading

    from ddp.comm import nvtx_ranges
    from ddp.training.data import rank_batch
    from ddp.training.models import build_model

    names, ended = {}, {}
    nvtx_ranges.start = lambda name, payload=None: names.setdefault(len(names) + 1, name) and len(names)
    nvtx_ranges.end = lambda rid: ended.__setitem__(names[rid], threading.current_thread().name)
    model = registry.wrap("overlap", build_model("tiny", 16))
    opt = make_optimizer("sgd", model.module.parameters(), 0.1)
    train_step(model, opt, rank_batch("tiny", 0, 2 * ctx.world_size, 16, ctx.rank, ctx.world_size), 0)
    dist.barrier()
    return {**ended, "main": threading.current_thread().name}
