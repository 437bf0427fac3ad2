"""The buckets a strategy would build at a given cap, with the rules the strategies really use.

Both bucketed strategies take parameters in the order their gradients arrived in the first step (they
rebuild their buckets once from it; before, reverse `module.parameters()` order) and cap the first bucket
at FIRST_BUCKET_MB (or the cap, if smaller) so communication starts early in backward. They differ in
where a bucket closes:
  "before"  OverlapBucketDDP (`overlap_bucket`): before the parameter that would take it past the cap;
  "after"   PyTorch DDP (`torch`): after the parameter that reaches the cap.
A parameter larger than the cap gets a bucket of its own under both rules.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

MIB = 2**20
FIRST_BUCKET_MB = 1.0  # DDP's first bucket (dist._DEFAULT_FIRST_BUCKET_BYTES) and OverlapBucketDDP's default
RULES = ("before", "after")


def first_cap_bytes(cap_mb: float) -> float:
    return min(FIRST_BUCKET_MB, cap_mb) * MIB


def plan_buckets(sizes: ArrayLike, cap_mb: float, rule: str) -> list[np.ndarray]:
    """Index arrays into `sizes` (parameters in arrival order), one per bucket, in launch order."""
    if rule not in RULES:
        raise ValueError(f"bucket rule {rule!r}: expected one of {', '.join(RULES)}")
    if not cap_mb > 0:
        raise ValueError(f"bucket size {cap_mb!r} MiB: must be positive")
    sizes = np.asarray(sizes, dtype=float)
    buckets: list[list[int]] = []
    current: list[int] = []
    filled = 0.0
    cap = first_cap_bytes(cap_mb)
    # one pass over the model's parameters (hundreds, not trace events): the rule is sequential
    for i, size in enumerate(sizes):
        if rule == "before" and current and filled + size > cap:
            buckets.append(current)
            current, filled, cap = [], 0.0, cap_mb * MIB
        current.append(i)
        filled += size
        if rule == "after" and filled >= cap:
            buckets.append(current)
            current, filled, cap = [], 0.0, cap_mb * MIB
    if current:
        buckets.append(current)
    return [np.asarray(b, dtype=np.int64) for b in buckets]
