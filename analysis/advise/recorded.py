"""A recorded run as both layouts read it: which layout models it (and the refusal of the runs neither
does), its `ddp.meta`, and the rank-steps every rank has.

The bucket layout (buckets/) predicts DDP's bucket size from a run of a strategy that overlaps
communication with backward; the sharded layout (sharded/) predicts the prefetch depth and the
reduce-scatters' communicator of an fsdp / torch_fsdp run.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from analysis.errors import TraceError
from analysis.trace.frames import Trace
from analysis.trace.readers.nsys_nvtx import declared_implementations

# implementation -> (kind of recorded collectives, bucket rule of the strategy that takes a bucket size)
STRATEGIES = {"overlap": ("param", "before"), "overlap_bucket": ("bucket", "before"), "torch": ("bucket", "after")}
SHARDED = ("fsdp", "torch_fsdp")


def run_meta(trace: Trace) -> dict:
    """The first rank's `ddp.meta` (every rank records the same layout), or {}."""
    return next(iter(trace.meta.values()), {}) if trace.meta else {}


def unsupported(path: str, impl: str) -> TraceError:
    return TraceError(
        f"{path}: implementation {impl}: advise predicts DDP's bucket size from a run of {', '.join(STRATEGIES)}, "
        f"and a sharded run's prefetch depth and reduce-scatter communicator from a run of {', '.join(SHARDED)}"
    )


def bucketed_implementation(trace: Trace) -> str:
    """The run's implementation, refused unless the bucket layout models it."""
    impl = trace.implementation or next((str(m.get("implementation")) for m in trace.meta.values()), "")
    if impl not in STRATEGIES:
        raise unsupported(trace.path, impl or "unknown (no ddp.meta mark)")
    return impl


def check_declared(paths: Sequence[Path]) -> None:
    """Refuse a run whose nsys exports declare only strategies advise does not model, before loading it."""
    for path in paths:
        declared = declared_implementations(path)
        if declared and not declared & {*STRATEGIES, *SHARDED}:
            raise unsupported(str(path), ", ".join(sorted(declared)))


def every_rank(frame: pd.DataFrame, ranks: int) -> pd.DataFrame:
    """The rows (rank, step, ...) of the steps all `ranks` ranks have, sorted by step then rank."""
    counts = frame.groupby("step")["rank"].transform("size")
    return frame[counts == ranks].sort_values(["step", "rank"]).reset_index(drop=True)
