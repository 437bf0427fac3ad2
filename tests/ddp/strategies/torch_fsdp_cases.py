"""Rank workers for the torch_fsdp tests (module level: spawned ranks import them)."""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from ddp.comm import nvtx_ranges
from ddp.launch.launcher import DistContext
from ddp.strategies import registry
from ddp.strategies.torch_fsdp import unit_parameters
from ddp.training.data import shard
from ddp.training.loop import train_step
from tests.ddp import cases
from tests.ddp.comm.test_nvtx_ranges import Recorder

ODD = 33  # rows that 2 ranks cannot split evenly: FSDP2 pads them to 34


class Odd(nn.Module):
    """Linear layers with an odd number of rows (padded shards) and a norm left to the root unit."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(cases.FEATURES, ODD)
        self.norm = nn.LayerNorm(ODD)
        self.out = nn.Linear(ODD, cases.CLASSES)

    def forward(self, x):
        return self.out(F.relu(self.norm(self.inp(x))))


def build(model: str, seed: int) -> nn.Module:
    if model == "odd":
        torch.manual_seed(seed)
        return Odd()
    return cases.build(model, seed)


def payloads_per_step(ctx: DistContext, model: str, dtype: torch.dtype | None, steps: int = 2) -> dict:
    """The comm ranges (name, payload) of each step as the wrapper emitted them, its stats and its layout."""
    module = build(model, seed=ctx.rank)
    wrapper = registry.wrap("torch_fsdp", module, compute_dtype=dtype)
    opt = torch.optim.SGD(module.parameters(), lr=0.01)
    at_forward = watch_unsharded_at_forward(wrapper)
    rec = Recorder()
    nvtx_ranges.range, nvtx_ranges.start, nvtx_ranges.end = rec.range, rec.start, rec.end  # this process only
    per_step, stats = [], []
    for step in range(steps):
        del rec.payloads[:], at_forward[:]
        train_step(wrapper, opt, shard(cases.batch(step, 8), ctx.rank, ctx.world_size), step)
        torch.distributed.barrier()
        per_step.append([(n, p) for n, p in rec.payloads if n.startswith("comm:")])
        s = wrapper.reset_comm_stats()
        stats.append((s.num_ops, s.bytes))
    master = {
        n: (str(p.dtype), str(p.grad.dtype) if p.grad is not None else None) for n, p in module.named_parameters()
    }
    memory = wrapper.memory_parts()
    return {
        "steps": per_step,
        "stats": stats,
        "layout": wrapper.sharded_layout(),
        "master": master,
        "memory": memory,
        "at_forward": at_forward,
    }


def watch_unsharded_at_forward(wrapper) -> list[tuple[str, int]]:
    """A list that each unit's forward fills with (its tag, the bytes of the storages behind its own parameters
    then): a forward pre-hook registered after FSDP2's, which has put the unsharded parameters in place."""
    seen: list[tuple[str, int]] = []
    for tag, unit in wrapper.units:
        names = [n for n, _ in unit_parameters(wrapper.module, unit, wrapper.units)]

        def hook(_m, _args, tag=tag, names=names) -> None:
            tensors = [wrapper.module.get_parameter(n) for n in names]
            seen.append((tag, sum(t.untyped_storage().nbytes() for t in tensors)))

        unit.register_forward_pre_hook(hook)
    return seen


def train_mixed(ctx: DistContext, model: str, dtype: torch.dtype, steps: int, lr: float) -> dict[str, torch.Tensor]:
    """torch_fsdp with compute_dtype `dtype`, SGD: every parameter in full after `steps` steps."""
    module = build(model, seed=ctx.rank)
    wrapper = registry.wrap("torch_fsdp", module, compute_dtype=dtype)
    opt = torch.optim.SGD(module.parameters(), lr=lr)
    for step in range(steps):
        train_step(wrapper, opt, shard(cases.batch(step, 8), ctx.rank, ctx.world_size), step)
    return wrapper.gather_full_params()


def mixed_worker(ctx: DistContext, runs: list[tuple[str, torch.dtype, int, float]]) -> list[dict]:
    return [train_mixed(ctx, *run) for run in runs]


def payloads_worker(ctx: DistContext, runs: list[tuple[str, torch.dtype | None]]) -> list[dict]:
    return [payloads_per_step(ctx, *run) for run in runs]


def reference_mixed(model: str, dtype: torch.dtype, steps: int, lr: float) -> dict[str, torch.Tensor]:
    """One process, whole batches, casting as the sharded strategies do: float32 master weights, a copy in
    `dtype` for forward and backward (inputs cast too), its gradients cast to float32 for the update."""
    master = build(model, seed=0)
    opt = torch.optim.SGD(master.parameters(), lr=lr)
    for step in range(steps):
        low = copy.deepcopy(master).to(dtype)
        x, y = cases.batch(step, 8)
        F.cross_entropy(low(x.to(dtype)), y).backward()
        for p, q in zip(master.parameters(), low.parameters(), strict=True):
            p.grad = None if q.grad is None else q.grad.float()
        opt.step()
    return {k: v.detach().clone() for k, v in master.named_parameters()}


def groups_per_collective(ctx: DistContext, kwargs: dict) -> dict:
    """Two steps of `toy` under torch_fsdp(**kwargs), counting each collective FSDP2 issued by (op, process group
    name), and in the second step how many all-gathers had been issued when each unit's forward began (hooks
    registered after FSDP2's run after its unshard and prefetch); the default group's name beside them."""
    from collections import Counter

    from ddp.strategies import torch_fsdp

    counts: Counter = Counter()
    issued: list[str] = []
    at_forward: list[tuple[str, int]] = []
    saved = torch_fsdp._all_gather, torch_fsdp._reduce_scatter

    def counted(function, op):
        def call(*args, group=None, **kw):
            counts[(op, group.group_name)] += 1
            issued.append(op)
            return function(*args, group=group, **kw)

        return call

    torch_fsdp._all_gather, torch_fsdp._reduce_scatter = counted(saved[0], "all_gather"), counted(saved[1], "rs")
    try:
        module = build("toy", seed=ctx.rank)
        wrapper = registry.wrap("torch_fsdp", module, **kwargs)
        opt = torch.optim.SGD(module.parameters(), lr=0.01)
        for name in ("fc1", "fc2", "fc3"):
            module.get_submodule(name).register_forward_pre_hook(
                lambda *_, n=name: at_forward.append((n, issued.count("all_gather")))
            )
        for step in range(2):
            del issued[:], at_forward[:]
            train_step(wrapper, opt, shard(cases.batch(step, 8), ctx.rank, ctx.world_size), step)
    finally:
        torch_fsdp._all_gather, torch_fsdp._reduce_scatter = saved
    default = torch.distributed.distributed_c10d._get_default_group().group_name
    return {"counts": dict(counts), "at_forward": at_forward, "default": default}


def groups_worker(ctx: DistContext, runs: list[dict]) -> list[dict]:
    return [groups_per_collective(ctx, kwargs) for kwargs in runs]
