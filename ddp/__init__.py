"""Data-parallel training wrappers behind one protocol, plus models, launcher and CLIs.

from ddp import NaiveDDP, FlatDDP, FSDP, HSDP, OverlapDDP, OverlapBucketDDP, TorchDDP, TorchFSDP, TorchHSDP,
    IMPLEMENTATIONS
"""

from ddp.optim.sharded_optimizer import ShardedOptimizer
from ddp.strategies.base import CommStats, DataParallelBase
from ddp.strategies.flat import FlatDDP
from ddp.strategies.fsdp import FSDP
from ddp.strategies.hsdp import HSDP
from ddp.strategies.naive import NaiveDDP
from ddp.strategies.overlap import OverlapDDP
from ddp.strategies.overlap_bucket import OverlapBucketDDP
from ddp.strategies.registry import IMPLEMENTATIONS
from ddp.strategies.torch_ddp import TorchDDP

__all__ = [
    "FSDP",
    "HSDP",
    "IMPLEMENTATIONS",
    "CommStats",
    "DataParallelBase",
    "FlatDDP",
    "NaiveDDP",
    "OverlapBucketDDP",
    "OverlapDDP",
    "ShardedOptimizer",
    "TorchDDP",
    "TorchFSDP",
    "TorchHSDP",
]


def __getattr__(name: str) -> object:
    """TorchFSDP and TorchHSDP, imported when first asked for (ddp/strategies/registry.py says why)."""
    lazy = {"TorchFSDP": "torch_fsdp", "TorchHSDP": "torch_hsdp"}
    if name not in lazy:
        raise AttributeError(f"module 'ddp' has no attribute {name!r}")
    from ddp.strategies import registry

    return registry.get(lazy[name])
