"""The training loop shared by the CLIs and profiling: one run's config, its steps, its timings.

Each step is an NVTX `step N` range holding `forward`, `backward`, `grad_sync` (inside the
wrapper) and `optimizer`. Timings cover measured steps only (warm-up excluded); on GPU the device
is synchronised once at the end of each step (never per collective), then the wrapper's
communication timing is read (ddp.comm.timing). Rank 0 gets every rank's figures.
"""

from __future__ import annotations

import contextlib
import gc
import os
import platform
import socket
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from contract import (
    BACKWARD,
    DATA,
    FORWARD,
    GROUPS_KEY,
    ISSUE,
    MEMORY_CUDA,
    OPTIMIZER,
    RUN_ID_KEY,
    SHARDING_KEY,
    SLOW_RANK_KEY,
    hsdp_groups,
    separate_reduce_scatter_groups,
    step_range,
)
from ddp.comm import nvtx_ranges
from ddp.launch.launcher import DistContext, run_id
from ddp.memory.accounting import SavedTensorBytes, optimizer_state_bytes
from ddp.optim.sharded_optimizer import ShardedOptimizer
from ddp.strategies import registry
from ddp.strategies.base import DataParallelBase, synchronize_device
from ddp.strategies.fsdp import DEFAULT_PREFETCH
from ddp.training.config import COMPUTE_DTYPES, OPTIMIZERS, RunConfig
from ddp.training.data import rank_batch
from ddp.training.models import MODEL_SIZES, build_model
from ddp.training.slow_rank import Stall, no_stall, slow_rank_meta, stall_of


@dataclass
class TrainResult:
    """Measured steps of one run, every rank's: lists indexed [rank][step]."""

    config: RunConfig
    step_time_s: list[list[float]]
    comm_time_s: list[list[float]]  # communication after backward ended (exposed)
    num_ops: list[list[int]]
    final_loss: float
    metadata: dict = field(default_factory=dict)
    comm_in_flight_s: list[list[float]] = field(default_factory=list)  # union of in-flight intervals
    comm_hidden_s: list[list[float]] = field(default_factory=list)  # its part during backward
    comm_clock: str = "host"
    memory: list[dict] = field(default_factory=list)  # per rank: memory_figures after the last step (bytes)

    @staticmethod
    def _slowest_rank_mean(per_rank: list[list[float]]) -> float:
        """Mean over steps of the slowest rank's value: a step is as slow as its slowest rank."""
        per_step = [max(values) for values in zip(*per_rank, strict=True)]
        return sum(per_step) / len(per_step)

    @property
    def avg_step_time_s(self) -> float:
        return self._slowest_rank_mean(self.step_time_s)

    @property
    def avg_comm_time_s(self) -> float:
        return self._slowest_rank_mean(self.comm_time_s)

    @property
    def comm_fraction(self) -> float:
        return self.avg_comm_time_s / self.avg_step_time_s

    @property
    def comm_overlap(self) -> float | None:
        """Fraction of in-flight communication during backward, pooled over ranks and steps."""
        total = sum(map(sum, self.comm_in_flight_s))
        return sum(map(sum, self.comm_hidden_s)) / total if total > 0 else None

    @property
    def avg_comm_in_flight_s(self) -> float:
        return self._slowest_rank_mean(self.comm_in_flight_s)

    @property
    def avg_num_ops(self) -> float:
        return sum(self.num_ops[0]) / len(self.num_ops[0])


def make_optimizer(
    name: str, params: Iterable[torch.nn.Parameter], lr: float, shard: bool = False
) -> torch.optim.Optimizer:
    """Plain SGD or AdamW (weight decay 0.01); `shard`: its state sharded across ranks (ShardedOptimizer)."""
    classes: dict[str, tuple[Any, dict]] = {
        "sgd": (torch.optim.SGD, {}),
        "adamw": (torch.optim.AdamW, {"weight_decay": 0.01}),
    }
    if name not in classes:
        raise ValueError(f"unknown optimizer {name!r}: choose from {', '.join(OPTIMIZERS)}")
    cls, kwargs = classes[name]
    if shard:
        return ShardedOptimizer(params, cls, lr=lr, **kwargs)
    return cls(params, lr=lr, **kwargs)


def run_optimizer(cfg: RunConfig, params: Iterable[torch.nn.Parameter]) -> torch.optim.Optimizer:
    """`cfg`'s optimizer over `params`; `shard_optimizer` wraps it in ShardedOptimizer (ZeRO-1) for the replicated
    strategies only: a sharded one (registry.SHARDED) steps only its own 1/W shards, so its state is split already."""
    return make_optimizer(cfg.optimizer, params, cfg.lr, cfg.shard_optimizer and cfg.impl not in registry.SHARDED)


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over every prediction (classes for toy, next tokens for the LM)."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def train_step(
    model: DataParallelBase,
    optimizer: torch.optim.Optimizer,
    batch: tuple[torch.Tensor, torch.Tensor],
    step: int,
    stall: Stall = no_stall,
) -> torch.Tensor:
    """One step inside NVTX `step N`: forward, backward, gradient sync, optimizer. Returns the loss.
    `stall(place)` is called at the start of each phase and before the gradient sync (`--slow-rank`)."""
    inputs, targets = batch
    with nvtx_ranges.range(step_range(step), cache=False):
        optimizer.zero_grad(set_to_none=True)
        with nvtx_ranges.range(FORWARD):
            stall(FORWARD)
            loss = loss_fn(model(inputs), targets)
        with nvtx_ranges.range(BACKWARD):
            stall(BACKWARD)
            loss.backward()
        stall(ISSUE)
        model.finish_gradient_synchronization()
        with nvtx_ranges.range(OPTIMIZER):
            stall(OPTIMIZER)
            optimizer.step()
    return loss.detach()


def step_batch(
    ctx: DistContext, cfg: RunConfig, step: int, stall: Stall = no_stall
) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's batch of `step`, made inside the NVTX `data` range (where the `data` stall sleeps)."""
    with nvtx_ranges.range(DATA):
        stall(DATA)
        return rank_batch(
            cfg.model, step, cfg.batch_size, cfg.context_length, ctx.rank, ctx.world_size, cfg.seed, ctx.device
        )


def build_wrapped(ctx: DistContext, cfg: RunConfig, seed: int | None = None) -> DataParallelBase:
    """The model of `cfg` on this rank's device inside implementation `cfg.impl`."""
    model = build_model(cfg.model, cfg.context_length, cfg.seed if seed is None else seed).to(ctx.device)
    kwargs: dict[str, Any] = {"compute_dtype": COMPUTE_DTYPES[cfg.compute_dtype]} if cfg.compute_dtype else {}
    if cfg.prefetch is not None:
        kwargs["prefetch"] = cfg.prefetch
    if cfg.separate_reduce_scatter:
        kwargs["separate_reduce_scatter"] = True
    if cfg.impl in registry.HYBRID:
        kwargs["shard_size"] = cfg.resolved_shard_size
    return registry.wrap(cfg.impl, model, cfg.bucket_mb, cfg.collective, **kwargs)


def sharding_settings(cfg: RunConfig) -> dict[str, Any]:
    """ddp.meta's `sharding` (contract.SHARDING_KEY) of a sharded run: the prefetch depth in effect (fsdp's
    default when unset; None: torch_fsdp left at FSDP2's own prefetching) and whether reduce-scatters ran on
    their own process group."""
    default = DEFAULT_PREFETCH if cfg.impl in ("fsdp", "hsdp") else None
    return {
        "prefetch": default if cfg.prefetch is None else cfg.prefetch,
        "separate_reduce_scatter": cfg.separate_reduce_scatter,
    }


# (model, memory) -> the region: `memory` is this rank's `memory_figures` after the warm-up, None without warm-up
MeasuredRegion = Callable[[DataParallelBase, dict | None], contextlib.AbstractContextManager]


def memory_figures(model: DataParallelBase, optimizer: torch.optim.Optimizer, activations: SavedTensorBytes) -> dict:
    """This rank's memory now, in bytes: the wrapper's parts (`memory_parts`, its contract) with the optimizer's
    state (this rank's share when sharded) and the activations counted during the first step, their `peak`
    (the sum), and `cuda_max_allocated` (torch.cuda.max_memory_allocated since the run began; None off CUDA)."""
    parts = model.memory_parts()
    parts.optimizer_state, parts.activations = optimizer_state_bytes(optimizer), activations.bytes
    device = next(iter(model.module.parameters()), torch.empty(0)).device
    cuda = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    return {**parts.as_bytes(), MEMORY_CUDA: cuda}


def run_training(ctx: DistContext, cfg: RunConfig, measured_region: MeasuredRegion | None = None) -> TrainResult:
    """Train `cfg.warmup + cfg.steps` steps on this rank; time the last `cfg.steps`.

    `measured_region(model, memory)`, if given, is called once right before the first measured step
    (`memory`: `memory_figures` then, None when there was no warm-up) and the context manager it returns
    is held open until the last measured step ends: profiling uses it to open the NVTX `profile` range
    and emit the `ddp.meta {json}` mark. Collective: every rank
    must call this; all ranks get the gathered result.
    """
    model = build_wrapped(ctx, cfg)
    optimizer = run_optimizer(cfg, model.module.parameters())
    model.reset_comm_stats()
    if ctx.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(ctx.device)
    activations = SavedTensorBytes([*model.module.parameters(), *model.module.buffers()], model.holds_weights)
    own: dict[str, Any] = {"step": [], "comm": [], "ops": [], "in_flight": [], "hidden": []}
    clock = "host"
    loss = torch.zeros(())
    stall = stall_of(cfg.slow_rank, ctx.rank)
    with contextlib.ExitStack() as region:
        for step in range(cfg.warmup + cfg.steps):
            if step == cfg.warmup:
                dist.barrier()  # measured steps start together on every rank
                if measured_region is not None:
                    memory = memory_figures(model, optimizer, activations) if cfg.warmup else None
                    region.enter_context(measured_region(model, memory))
            batch = step_batch(ctx, cfg, step, stall)
            synchronize_device(batch[0])
            t0 = time.perf_counter()
            with activations if step == 0 else contextlib.nullcontext():  # counted once: the same every step
                loss = train_step(model, optimizer, batch, step, stall)
            synchronize_device(batch[0])  # the step's one synchronisation
            elapsed = time.perf_counter() - t0
            stats = model.reset_comm_stats()  # reads its events: nothing left to wait for
            if step >= cfg.warmup:
                own["step"].append(elapsed)
                own["comm"].append(stats.comm_time_s)
                own["ops"].append(stats.num_ops)
                own["in_flight"].append(stats.in_flight_s)
                own["hidden"].append(stats.hidden_s)
                clock = stats.clock
    own["memory"] = memory_figures(model, optimizer, activations)  # after the last step: gradients, state exist
    # Free this run's model now, before a sweep builds the next one, not whenever the cyclic collector runs:
    # `activations` holds the model too (its `holds_weights`), so it goes with it.
    del model, optimizer, activations
    gc.collect()
    gathered: list = [None] * ctx.world_size
    dist.all_gather_object(gathered, own)
    return TrainResult(
        cfg,
        [g["step"] for g in gathered],
        [g["comm"] for g in gathered],
        [g["ops"] for g in gathered],
        float(loss),
        run_metadata(ctx, cfg),
        [g["in_flight"] for g in gathered],
        [g["hidden"] for g in gathered],
        clock,
        [g["memory"] for g in gathered],
    )


def run_metadata(ctx: DistContext, cfg: RunConfig) -> dict:
    """What profiling records in the `ddp.meta {json}` mark (JSON-serialisable)."""
    hybrid = cfg.impl in registry.HYBRID
    size = MODEL_SIZES.get(cfg.model)
    try:
        from importlib.metadata import version

        nvtx_version = version("nvtx")
    except Exception:  # not installed: the ranges are no-ops
        nvtx_version = None
    return {
        "implementation": cfg.impl,
        RUN_ID_KEY: run_id(),
        "rank": ctx.rank,
        "local_rank": ctx.local_rank,
        "world_size": ctx.world_size,
        "hostname": socket.gethostname(),
        "pid": os.getpid(),
        "model": cfg.model,
        "d_model": size.d_model if size else None,
        "num_layers": size.num_layers if size else None,
        "batch_size": cfg.batch_size,
        "context_length": cfg.context_length,
        "bucket_mb": cfg.bucket_mb if cfg.impl in registry.BUCKETED else None,
        "backend": ctx.backend,
        "collective": cfg.collective,
        "device": str(ctx.device),
        "steps": cfg.steps,
        "warmup": cfg.warmup,
        "optimizer": cfg.optimizer,
        "shard_optimizer": cfg.shard_optimizer,
        "versions": {"python": platform.python_version(), "torch": torch.__version__, "nvtx": nvtx_version},
        "argv": sys.argv[1:],
        **({SHARDING_KEY: sharding_settings(cfg)} if cfg.impl in registry.SHARDED else {}),
        **({GROUPS_KEY: separate_reduce_scatter_groups(ctx.world_size)} if cfg.separate_reduce_scatter else {}),
        **({GROUPS_KEY: hsdp_groups(ctx.world_size, cfg.resolved_shard_size, ctx.rank)} if hybrid else {}),
        SLOW_RANK_KEY: slow_rank_meta(cfg.slow_rank),
    }
