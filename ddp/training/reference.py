"""The single-process run a sharded strategy must reproduce bit for bit: `train_rank_slices`.

One process trains on each whole global batch, but forms each step's gradient as the ranks do: the
gradient of each rank's slice (its mean loss), summed in rank order, divided by the world size; for hsdp
and torch_hsdp summed within each shard group in rank order, then the groups' sums in order, as they sum
(contract.hsdp_layout). The parameters after every step are kept. A sharded strategy on 2 ranks gets the
same bits in fp32 (the sum of two gradients does not depend on the order gloo adds them in; with more ranks
it may, except for hsdp on 2 x 2: two sums of two). With a
compute dtype every module runs as FSDP runs it (ddp.sharding.unit_state.casting): its weights and
floating inputs cast to that dtype, gradients reaching the fp32 parameters.

Intra-op threads change the bits too (LayerNorm's backward sums per thread): the run uses the ranks'
thread count. It runs where the strategy ran (`device`: rank 0's, built on the CPU and moved there as the
ranks' models are): a GPU run compared with a CPU reference differs in the last bits whatever the strategy
(different kernels), so bit-identity can only be checked on the same device.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch

from contract import hsdp_layout
from ddp.sharding.unit_state import casting
from ddp.strategies.registry import HYBRID
from ddp.training.config import COMPUTE_DTYPES, RunConfig
from ddp.training.data import rank_batch
from ddp.training.loop import loss_fn, make_optimizer
from ddp.training.models import build_model


@contextlib.contextmanager
def deterministic(enabled: bool = True) -> Iterator[None]:
    """Deterministic algorithms while open (when `enabled`), restored after; on CUDA cuBLAS needs a fixed
    workspace for it (CUBLAS_WORKSPACE_CONFIG, set unless already set)."""
    before = torch.are_deterministic_algorithms_enabled()
    if enabled:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before)


@contextlib.contextmanager
def intra_op_threads(threads: int) -> Iterator[None]:
    """`threads` intra-op threads while open, restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def train_rank_slices(
    cfg: RunConfig, threads: int, device: torch.device | str = "cpu"
) -> list[dict[str, torch.Tensor]]:
    """Every parameter after each step of `cfg` trained in one process on `device` as described in the module
    docstring (copied to the CPU)."""
    dtype = COMPUTE_DTYPES[cfg.compute_dtype] if cfg.compute_dtype is not None else None
    with intra_op_threads(threads), deterministic():
        model = build_model(cfg.model, cfg.context_length, cfg.seed).to(device)
        optimizer = make_optimizer(cfg.optimizer, model.parameters(), cfg.lr)
        history = []
        for step in range(cfg.steps):
            total: dict[str, torch.Tensor] = {}
            for group in summation_groups(cfg):
                partial: dict[str, torch.Tensor] = {}
                for rank in group:
                    model.zero_grad(set_to_none=True)
                    inputs, targets = rank_batch(
                        cfg.model, step, cfg.batch_size, cfg.context_length, rank, cfg.world_size, cfg.seed, device
                    )
                    with casting(model, dtype):
                        loss_fn(model(inputs), targets).backward()
                    for name, p in model.named_parameters():
                        if p.grad is not None:
                            partial[name] = partial[name] + p.grad if name in partial else p.grad.clone()
                for name, g in partial.items():
                    total[name] = total[name] + g if name in total else g
            for name, p in model.named_parameters():
                p.grad = total[name] / cfg.world_size if name in total else None
            optimizer.step()
            history.append(cpu_copies(model))
    return history


def summation_groups(cfg: RunConfig) -> list[list[int]]:
    """The ranks whose gradients are summed first, group by group (hsdp: the shard groups; else all ranks)."""
    if cfg.impl in HYBRID:
        return hsdp_layout(cfg.world_size, cfg.resolved_shard_size)[0]
    return [list(range(cfg.world_size))]


def cpu_copies(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter of `model`, copied to the CPU (bit for bit), under its name."""
    return {k: v.detach().to("cpu", copy=True) for k, v in model.named_parameters()}
