"""The run's metadata: nsys traces carry it in an NVTX mark `ddp.meta {json}` (one per rank, at the start of
the captured region), torch.profiler traces in the top-level JSON key `ddp.meta`."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

META_PREFIX = "ddp.meta "  # the mark's text: this prefix, then one line of JSON (an object)
META_KEY = "ddp.meta"  # the top-level key of a torch.profiler (Kineto) JSON trace
# torch.profiler traces: our recorder's async ranges are `user_annotation` events with args {ddp.kind: start_end}
ASYNC_KIND_KEY = "ddp.kind"
ASYNC_KIND = "start_end"
# torch.profiler traces: a comm range's integer payload (its collective's bytes, names.COMM_PAYLOAD), which nsys
# stores in NVTX_EVENTS.int64Value, is the args value of this key on the range's `user_annotation` event
PAYLOAD_KEY = "ddp.payload"

# One id per run, the same on every rank (a uuid the launcher hands its ranks in RUN_ID_ENV, or torchrun's rendezvous
# id): files whose ids differ are of different runs, and analysis refuses to merge them.
RUN_ID_KEY = "run_id"
RUN_ID_ENV = "DDP_RUN_ID"

# Sharded strategies (fsdp, torch_fsdp) list their sharded modules under this key, one entry per module in forward
# order: {"name": module name (the tag of its comm:all_gather / comm:reduce_scatter ranges), "params": the
# original parameter names it holds, "numel": their elements (unpadded), "padded_numel": what one all-gather
# returns (a multiple of world_size), "all_gather_bytes" / "reduce_scatter_bytes": the payload of one such range,
# "shard_bytes": what each rank stores of it (float32 master weights)}. Replicated strategies omit the key.
SHARDED_KEY = "sharded"
SHARDED_FIELDS = ("name", "params", "numel", "padded_numel", "all_gather_bytes", "reduce_scatter_bytes", "shard_bytes")

# Sharded strategies' settings under this key: {"prefetch": a unit's all-gather is issued once the unit that many
# places before it has finished (1: on demand; null: torch_fsdp left at FSDP2's own prefetching),
# "separate_reduce_scatter": whether the reduce-scatters ran on a process group of their own (on NCCL: their own
# communicator and stream, not queued behind the all-gathers)}. Replicated strategies omit the key.
SHARDING_KEY = "sharding"
SHARDING_FIELDS = ("prefetch", "separate_reduce_scatter")

# `--slow-rank RANK:PLACE:MS` of a run made slow on purpose: {"rank": int, "place": one of names.SLOW_PLACES,
# "ms": the stall per step}; null when no rank was slowed.
SLOW_RANK_KEY = "slow_rank"

# Each rank's memory after the warm-up, in bytes (docs/memory.md): the parts of ddp.memory.accounting.MemoryParts,
# their sum `peak`, and `cuda_max_allocated` (torch.cuda.max_memory_allocated; null off CUDA).
MEMORY_KEY = "memory"
MEMORY_PARTS = ("parameters", "gradients", "optimizer_state", "gathered", "comm_buffers", "activations")
MEMORY_PEAK, MEMORY_CUDA = "peak", "cuda_max_allocated"


def sharded_entry(
    name: str, params: list[str], numel: int, padded_numel: int, comm_itemsize: int, shard_itemsize: int, world: int
) -> dict[str, Any]:
    """One `sharded` entry: a module of `numel` elements padded to `padded_numel`, communicated in a dtype of
    `comm_itemsize` bytes, stored as 1/`world` slices of `shard_itemsize` bytes per element."""
    if padded_numel < numel or padded_numel % world:
        raise ValueError(f"padded_numel {padded_numel} must be >= numel {numel} and a multiple of world {world}")
    return {
        "name": name,
        "params": list(params),
        "numel": numel,
        "padded_numel": padded_numel,
        "all_gather_bytes": padded_numel * comm_itemsize,
        "reduce_scatter_bytes": padded_numel * comm_itemsize,
        "shard_bytes": padded_numel // world * shard_itemsize,
    }


def encode_meta(meta: Mapping[str, Any]) -> str:
    """The text of the metadata mark: `ddp.meta ` then compact, key-sorted JSON (non-JSON values as str)."""
    return META_PREFIX + json.dumps(dict(meta), sort_keys=True, separators=(",", ":"), default=str)


def decode_meta(text: str) -> dict | None:
    """The metadata of a mark's text; None when it is not a `ddp.meta` mark, its JSON is malformed or not an object."""
    if not isinstance(text, str) or not text.startswith(META_PREFIX):
        return None
    try:
        value = json.loads(text[len(META_PREFIX) :])
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None
