"""Data-parallel training wrappers behind one protocol, plus models, launcher and CLIs.

from ddp import NaiveDDP, FlatDDP, OverlapDDP, BucketedDDP, TorchDDP, IMPLEMENTATIONS
"""

from ddp.base import CommStats, DataParallelBase
from ddp.bucketed import BucketedDDP
from ddp.flat import FlatDDP
from ddp.naive import NaiveDDP
from ddp.overlap_per_param import OverlapDDP
from ddp.registry import IMPLEMENTATIONS
from ddp.torch_ddp import TorchDDP

__all__ = [
    "IMPLEMENTATIONS",
    "BucketedDDP",
    "CommStats",
    "DataParallelBase",
    "FlatDDP",
    "NaiveDDP",
    "OverlapDDP",
    "TorchDDP",
]
