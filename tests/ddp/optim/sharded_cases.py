"""Rank workers for the ShardedOptimizer tests (module level: spawned ranks import them)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ddp.launch.launcher import DistContext
from ddp.optim.sharded_optimizer import ShardedOptimizer, state_bytes
from ddp.strategies import registry
from ddp.training.data import shard
from tests.ddp import cases


def sharded_and_plain(ctx: DistContext, case: dict) -> dict:
    """One case trained twice, with the optimizer sharded and plain: the parameters of both."""
    return {
        "sharded": cases.run_case(ctx, {**case, "shard": True})["params"],
        "plain": cases.run_case(ctx, {**case, "shard": False})["params"],
    }


def many_cases(ctx: DistContext, cases_: list[dict]) -> list[dict]:
    return [sharded_and_plain(ctx, case) for case in cases_]


def _groups(module: torch.nn.Module) -> list[dict]:
    """fc1 apart, with its own learning rate and no weight decay; fc3 left out (added after step 1)."""
    return [
        {"params": list(module.fc1.parameters()), "lr": 0.02, "weight_decay": 0.0},
        {"params": list(module.fc2.parameters())},
    ]


def train_groups(ctx: DistContext, impl: str, sharded: bool, steps: int = 4) -> dict:
    """Param groups, add_param_group after the first step and a scheduler, sharded or not."""
    module = cases.build("tied", seed=ctx.rank)
    wrapper = registry.wrap(impl, module, 25)
    if sharded:
        opt: torch.optim.Optimizer = ShardedOptimizer(_groups(module), torch.optim.AdamW, lr=0.01, weight_decay=0.05)
    else:
        opt = torch.optim.AdamW(_groups(module), lr=0.01, weight_decay=0.05)
    schedule = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    for step in range(steps):
        if step == 1:
            opt.add_param_group({"params": list(module.fc3.parameters()), "lr": 0.005})
        x, y = shard(cases.batch(step, 6), ctx.rank, ctx.world_size)
        opt.zero_grad()
        F.cross_entropy(wrapper(x), y).backward()
        wrapper.finish_gradient_synchronization()
        opt.step()
        schedule.step()
    local = opt.local_optimizer if isinstance(opt, ShardedOptimizer) else opt
    owned = opt.owned_parameters() if isinstance(opt, ShardedOptimizer) else list(module.parameters())
    return {
        "params": {k: v.detach().clone() for k, v in module.named_parameters()},
        "state_bytes": state_bytes(local),
        "owned_numel": sum(p.numel() for p in owned),
        "state_params_owned": all(any(p is q for q in owned) for p in local.state),
        "lrs": [g["lr"] for g in opt.param_groups],
    }


def groups_worker(ctx: DistContext, impls: list[str]) -> list[dict]:
    """Every rank's outcome (gathered), sharded then plain, for each implementation."""
    out = []
    for impl in impls:
        mine = {"sharded": train_groups(ctx, impl, True), "plain": train_groups(ctx, impl, False)}
        everyone: list = [None] * ctx.world_size
        torch.distributed.all_gather_object(everyone, mine)
        out.append(everyone)
    return out
