"""The Python API behind `python -m analysis.advise`: `advise(paths, bucket_mb, prefetch=...)`.

Each run is opened once and goes to its layout (recorded.py): a DDP run to the bucket-size what-if
(buckets/), a sharded run to the prefetch / reduce-scatter what-if (sharded/). Both fit the collective
cost (comm_cost.py) and the compute slowdown (slowdown.py) on the recorded steps, replay the step at
each candidate setting, give each prediction its bootstrap interval and keep the recorded setting unless
a gain exceeds its uncertainty (uncertainty.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from analysis.advise.buckets.predict import advise_buckets
from analysis.advise.buckets.result import Advice
from analysis.advise.recorded import SHARDED, bucketed_implementation, check_declared, run_meta
from analysis.advise.sharded.predict import advise_sharded
from analysis.advise.sharded.result import ShardAdvice
from analysis.api import open_runs
from analysis.errors import TraceError
from analysis.trace.patterns import Patterns


def advise(
    paths: str | Path | Iterable[str | Path],
    bucket_mb: Iterable[float] | None = None,
    merge: bool = False,
    patterns: Patterns | None = None,
    prefetch: Iterable[int] | None = None,
) -> list[Advice | ShardAdvice]:
    """One Advice per DDP run (buckets/: bucket sizes `bucket_mb`) or ShardAdvice per sharded run (sharded/:
    prefetch depths `prefetch`); runs as the CLIs find them (merge=True: all paths one run's per-rank files)."""
    runs = open_runs(paths, merge=merge, patterns=patterns, keep_traces=False)  # each run read once, in turn
    for run in runs.runs:
        check_declared(run.paths)
    out: list[Advice | ShardAdvice] = []
    for i in range(len(runs.runs)):
        loaded = runs.loaded(i)
        trace = loaded.trace
        impl = trace.implementation or str(run_meta(trace).get("implementation") or "")
        if impl in SHARDED:
            if bucket_mb:
                raise TraceError(f"{trace.path}: --bucket-mb applies to DDP runs; {impl} is sharded (see --prefetch)")
            out.append(advise_sharded(loaded, impl, prefetch))
        elif prefetch:
            raise TraceError(f"{trace.path}: --prefetch applies to sharded runs ({', '.join(SHARDED)}); not {impl}")
        else:
            out.append(advise_buckets(loaded, bucketed_implementation(trace), bucket_mb))
    return out
