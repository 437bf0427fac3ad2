"""The measured region of a profiled run: the NVTX range `profile` that opens and closes nsys's capture.

Every rank pushes `profile` after its warm-up and marks `ddp.meta {json}` with the run's metadata,
so a trace says what it holds (implementation, rank, world size, model, versions, ...) without
trusting its file name, and how the wrapper groups gradients: `buckets`, one entry per collective
of a step, {name: the <tag> of its `comm:all_reduce:<tag>` range, params: parameter names, bytes:
the range's payload} (bucket<i> for overlap_bucket and torch, `flat` for flat, one per parameter
for naive and overlap; the "had a gradient" flags are inside the bytes of the collective carrying
them). Buckets are rebuilt once from the first step's gradient order, so with one warm-up step or
more (torch: two) this is the layout of every captured step.

Barriers line the ranks up at both ends: nsys starts capturing at the first
push and stops at the first pop of `profile` (`--capture-range-end=stop`), and a rank still inside
its last step at that moment would have that step cut short in the trace.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import torch.distributed as dist

from contract import MEMORY_KEY, PROFILE, SHARDED_KEY, encode_meta
from ddp.comm import nvtx_ranges

if TYPE_CHECKING:
    from ddp.strategies.base import DataParallelBase


def tool_versions() -> dict[str, str | None]:
    """GPU stack versions, beside the python/torch/nvtx ones `ddp.training.loop.run_metadata` records;
    None (JSON null) for what the run does not have: no CUDA or NCCL on a CPU build."""
    import torch

    from ddp.launch.gpu_sharing import loaded_nccl

    loaded = loaded_nccl()  # what the ranks really run (an LD_PRELOAD may replace torch's own)
    return {
        "cuda": torch.version.cuda,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else None,
        "nccl_loaded": ".".join(map(str, loaded.version)) if loaded else None,
    }


def _barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def param_bytes(model: DataParallelBase) -> dict[str, int]:
    """Each parameter's gradient bytes by name, in `module.parameters()` order (ddp.meta's `param_bytes`:
    analysis.advise places a bucket's gradients by size)."""
    return {n: p.numel() * p.element_size() for n, p in zip(model.param_names, model.params, strict=True)}


def model_meta(model: DataParallelBase) -> dict[str, Any]:
    """What ddp.meta says of the wrapper: its all-reduce `buckets`, `param_bytes` and, for a sharded strategy,
    its `sharded` modules (contract.SHARDED_KEY)."""
    meta: dict[str, Any] = {"buckets": model.comm_layout(), "param_bytes": param_bytes(model)}
    sharded = model.sharded_layout()
    if sharded:
        meta[SHARDED_KEY] = sharded
    return meta


def run_meta(
    meta: Mapping[str, Any], model: DataParallelBase | None = None, memory: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The `ddp.meta` of a run: `meta`, plus `model`'s layout (model_meta) and `memory` when given."""
    out = {**meta, **(model_meta(model) if model is not None else {})}
    return {**out, MEMORY_KEY: memory} if memory is not None else out


@contextlib.contextmanager
def measured_region(
    meta: Mapping[str, Any], model: DataParallelBase | None = None, memory: Mapping[str, Any] | None = None
) -> Iterator[None]:
    """Wrap the measured steps: barrier, push `profile`, ..., mark `ddp.meta` (with `model`'s bucket
    layout and this rank's `memory` figures (ddp.training.loop.memory_figures), if given), barrier, pop.

    The mark comes after the steps: PyTorch DDP rebuilds its buckets in its second step, so a layout read
    before a run with one warm-up step would be the one the measured steps no longer use."""
    _barrier()
    with nvtx_ranges.range(PROFILE):
        yield
        nvtx_ranges.mark(encode_meta(run_meta(meta, model, memory)))
        _barrier()
