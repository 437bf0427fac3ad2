"""Implementation name -> wrapper class: the one list every CLI, test and benchmark chooses from."""

from __future__ import annotations

import importlib
from typing import Any

from torch import nn

from ddp.strategies.base import DataParallelBase
from ddp.strategies.flat import FlatDDP
from ddp.strategies.fsdp import FSDP
from ddp.strategies.hsdp import HSDP
from ddp.strategies.naive import NaiveDDP
from ddp.strategies.overlap import OverlapDDP
from ddp.strategies.overlap_bucket import OverlapBucketDDP
from ddp.strategies.torch_ddp import TorchDDP

# FSDP2's wrappers are named by module and class and imported when first asked for: importing FSDP2 and
# DTensor costs about 1 s of CPU (a quarter of the imports) in every process that imports this registry,
# each rank, runner and CLI among them, most of which never use them.
IMPLEMENTATIONS: dict[str, type[DataParallelBase] | str] = {
    "naive": NaiveDDP,
    "flat": FlatDDP,
    "overlap": OverlapDDP,
    "overlap_bucket": OverlapBucketDDP,
    "torch": TorchDDP,
    "fsdp": FSDP,
    "torch_fsdp": "ddp.strategies.torch_fsdp:TorchFSDP",
    "hsdp": HSDP,
    "torch_hsdp": "ddp.strategies.torch_hsdp:TorchHSDP",
}

BUCKETED = ("overlap_bucket", "torch")  # the implementations that take bucket_size_mb
# The implementations that shard parameters, gradients and optimizer state (they take compute_dtype); the
# others replicate them and all-reduce gradients.
SHARDED = ("fsdp", "torch_fsdp", "hsdp", "torch_hsdp")
HYBRID = ("hsdp", "torch_hsdp")  # sharded within shard groups, all-reduced across replicas: they take shard_size
REPLICATED = tuple(n for n in IMPLEMENTATIONS if n not in SHARDED)


def get(name: str) -> type[DataParallelBase]:
    """The wrapper class registered as `name`; ValueError naming the valid choices otherwise."""
    if name not in IMPLEMENTATIONS:
        raise ValueError(f"unknown implementation {name!r}: choose from {', '.join(IMPLEMENTATIONS)}")
    cls = IMPLEMENTATIONS[name]
    if isinstance(cls, str):  # "module:class"
        module, _, attr = cls.partition(":")
        return getattr(importlib.import_module(module), attr)
    return cls


def resolve(names: list[str]) -> list[str]:
    """Expand 'all' and check each name, keeping the registry's order and dropping repeats."""
    for name in names:
        if name != "all":
            get(name)
    return [n for n in IMPLEMENTATIONS if "all" in names or n in names]


def wrap(
    name: str, module: nn.Module, bucket_size_mb: float | None = 25, collective: str = "torch", **kwargs: Any
) -> DataParallelBase:
    """Construct implementation `name` around `module`, passing the bucket size where it applies."""
    cls = get(name)
    if name in BUCKETED:
        kwargs["bucket_size_mb"] = bucket_size_mb
    return cls(module, collective=collective, **kwargs)
