"""Gradient buckets: which parameters share one collective, with the rules the bucketed strategies use.

Parameters are taken in the order given (their gradients' arrival order), and a bucket is closed
  "before"  the parameter that would take it past the cap (OverlapBucketDDP, `overlap_bucket`), or
  "after"   the parameter that reaches the cap (PyTorch DDP, `torch`).
A parameter larger than the cap gets a bucket of its own under both rules. The first bucket may have a
cap of its own (DDP's FIRST_BUCKET_MB), so that communication starts early in backward. Plain Python on
byte counts: `ddp/` builds its buckets with it, `analysis/` replays other bucket sizes with it.
"""

from __future__ import annotations

from collections.abc import Collection

MIB = 2**20
FIRST_BUCKET_MB = 1.0  # DDP's first bucket (dist._DEFAULT_FIRST_BUCKET_BYTES) and OverlapBucketDDP's default
RULES = ("before", "after")


def plan_buckets(
    sizes_bytes: Collection[float], cap_bytes: float | None, first_cap_bytes: float | None = None, rule: str = "before"
) -> list[list[int]]:
    """Item indices, in the given order, grouped into buckets of at most `cap_bytes` (None: one bucket)
    closed by `rule`; `first_cap_bytes`, if given, caps the first bucket instead."""
    if rule not in RULES:
        raise ValueError(f"bucket rule {rule!r}: expected one of {', '.join(RULES)}")
    if cap_bytes is None:
        return [list(range(len(sizes_bytes)))] if len(sizes_bytes) else []
    if not cap_bytes > 0:
        raise ValueError(f"bucket cap {cap_bytes!r} bytes: must be positive")
    plan: list[list[int]] = []
    current: list[int] = []
    filled = 0.0
    # one pass over the model's parameters (hundreds, not trace events): the rule is sequential
    for i, size in enumerate(sizes_bytes):
        cap = first_cap_bytes if not plan and first_cap_bytes is not None else cap_bytes
        if rule == "before" and current and filled + size > cap:
            plan.append(current)
            current, filled = [], 0.0
        current.append(i)
        filled += size
        if rule == "after" and filled >= cap:
            plan.append(current)
            current, filled = [], 0.0
    if current:
        plan.append(current)
    return plan
