"""The Python API behind `python -m analysis.advise`: `advise(paths, bucket_mb) -> list[Advice]`.

From one recorded run of a strategy that overlaps communication with backward (per-parameter `overlap`,
bucketed `overlap_bucket` or `torch`) it builds the model's inputs (measures/bucket_model.RecordedRun)
and predicts the step at each candidate bucket size. Gradient ready times: per-parameter runs have
one collective per parameter, issued when its gradient arrived; bucketed runs have one per bucket, and
the bucket's parameters (from `ddp.meta`'s bucket layout) are placed by size in their arrival order
between the previous bucket's issue and their own. On GPU traces a collective's time is its kernel's.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.engine.runs import find_runs, load_trace
from analysis.errors import TraceError
from analysis.frames.patterns import Patterns
from analysis.frames.trace import KERNELS, NS_PER_MS, Trace
from analysis.measures.activity import RankWork, rank_work
from analysis.measures.bucket_layout import plan_buckets
from analysis.measures.bucket_model import RecordedRun, fit_slowdown, place_in_buckets, replay
from analysis.measures.collective_calls import find_calls
from analysis.measures.comm_cost import CommCost, fit_cost, transfer_times
from analysis.measures.metrics import measure_trace
from analysis.measures.pairing import world_size

DEFAULT_BUCKETS_MB = (1.0, 2.0, 5.0, 10.0, 25.0, 50.0, 100.0)
FLAG_BYTES = 4  # every wrapper but `torch` sends a 4-byte "had a gradient" flag per parameter
# implementation -> (kind of recorded collectives, bucket rule of the strategy that takes a bucket size)
STRATEGIES = {"overlap": ("param", "before"), "overlap_bucket": ("bucket", "before"), "torch": ("bucket", "after")}


@dataclass(frozen=True)
class Candidate:
    bucket_mb: float
    buckets: int
    predicted_step_ms: float
    predicted_exposed_comm_ms: float


@dataclass(frozen=True)
class Advice:
    """One run's measured figures, bounds and predictions (see docs/advise.md)."""

    implementation: str
    trace: str
    recorded_bucket_mb: float | None
    steps: int  # rank-steps the figures average over
    measured_step_ms: float
    measured_exposed_comm_ms: float
    ideal_step_ms: float
    floor_step_ms: float
    slowdown: float
    cost: CommCost
    candidates: list[Candidate] = field(default_factory=list)

    @property
    def recommended_bucket_mb(self) -> float | None:
        if not self.candidates:
            return None
        return min(self.candidates, key=lambda c: c.predicted_step_ms).bucket_mb

    def to_json(self) -> dict:
        lines = [self.cost.overall, *self.cost.ranges]
        return {
            "implementation": self.implementation,
            "trace": self.trace,
            "recorded_bucket_mb": self.recorded_bucket_mb,
            "steps": self.steps,
            "measured_step_ms": round(self.measured_step_ms, 3),
            "measured_exposed_comm_ms": round(self.measured_exposed_comm_ms, 3),
            "ideal_step_ms": round(self.ideal_step_ms, 3),
            "floor_step_ms": round(self.floor_step_ms, 3),
            "compute_slowdown": round(self.slowdown, 4),
            "comm_cost": [
                {
                    "min_bytes": line.lo_bytes,
                    "max_bytes": None if np.isinf(line.hi_bytes) else line.hi_bytes,
                    "latency_us": round(line.latency_ns / 1e3, 3),
                    "bandwidth_gb_s": None if np.isinf(line.bandwidth_gbps) else round(line.bandwidth_gbps, 4),
                    "calls": line.calls,
                }
                for line in lines
            ],
            "candidates": [
                {
                    "bucket_mb": c.bucket_mb,
                    "buckets": c.buckets,
                    "predicted_step_ms": round(c.predicted_step_ms, 3),
                    "predicted_exposed_comm_ms": round(c.predicted_exposed_comm_ms, 3),
                }
                for c in self.candidates
            ],
            "recommended_bucket_mb": self.recommended_bucket_mb,
        }


def run_meta(trace: Trace) -> dict:
    """The first rank's `ddp.meta` (every rank records the same layout), or {}."""
    return next(iter(trace.meta.values()), {}) if trace.meta else {}


def _implementation(trace: Trace) -> str:
    impl = trace.implementation or next((str(m.get("implementation")) for m in trace.meta.values()), "")
    if impl not in STRATEGIES:
        raise TraceError(
            f"{trace.path}: implementation {impl or 'unknown (no ddp.meta mark)'}: advise needs a run that overlaps "
            f"communication with backward ({', '.join(STRATEGIES)})"
        )
    return impl


def _backward_windows(works: list[RankWork]) -> pd.DataFrame:
    """rank, step, backward_start, backward_end: each step's backward compute (first start, last end)."""
    frames = []
    for w in works:  # one per rank
        items = w.steps.backward
        keep = items.window >= 0
        f = pd.DataFrame({"window": items.window[keep], "start": items.start[keep], "end": items.end[keep]})
        g = f.groupby("window").agg(backward_start=("start", "min"), backward_end=("end", "max"))
        g["step"] = w.windows["step"].to_numpy()[g.index.to_numpy()]
        frames.append(g.assign(rank=w.rank).reset_index(drop=True))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def _bucket_members(trace: Trace, tags: Sequence[str]) -> tuple[list[list[str]], list[int]]:
    """Each recorded bucket's parameter names (in arrival order) and payload bytes, from rank 0's ddp.meta."""
    meta = run_meta(trace)
    layout = {b.get("name"): b for b in meta.get("buckets") or [] if isinstance(b, dict)}
    missing = [t for t in tags if t not in layout or not layout[t].get("params")]
    if missing:
        raise TraceError(f"{trace.path}: no bucket layout in ddp.meta for {', '.join(missing)}: cannot place gradients")
    return [list(layout[t]["params"]) for t in tags], [int(layout[t]["bytes"]) for t in tags]


def _param_bytes(trace: Trace, members: list[list[str]], payload: list[int], flags: int) -> np.ndarray:
    """Gradient bytes per parameter: `ddp.meta`'s param_bytes when recorded, else each bucket's payload
    (less its flags) shared equally among its parameters."""
    meta = run_meta(trace)
    recorded = meta.get("param_bytes")
    known: dict = recorded if isinstance(recorded, dict) else {}
    out = []
    for names, total in zip(members, payload, strict=True):
        share = (total - flags * len(names)) / len(names)
        out += [float(known.get(n, share)) for n in names]
    return np.asarray(out)


def _complete(frame: pd.DataFrame, ranks: int) -> pd.DataFrame:
    """Rows (rank, step, ...) without gaps, of the steps every rank has; sorted by step then rank."""
    frame = frame.dropna()
    counts = frame.groupby("step")["rank"].transform("size")
    return frame[counts == ranks].sort_values(["step", "rank"]).reset_index(drop=True)


def recorded_run(trace: Trace, patterns: Patterns | None = None) -> tuple[RecordedRun, pd.DataFrame, CommCost]:
    """The model's inputs from a loaded trace, the per rank-step measured figures it kept, and the fitted cost."""
    impl = _implementation(trace)
    kind, _ = STRATEGIES[impl]
    flags = 0 if impl == "torch" else FLAG_BYTES
    works = rank_work(trace, patterns)
    calls_found = find_calls(trace, patterns, works)
    calls = calls_found.frame
    calls = calls[(calls["op"] == "all_reduce") & (calls["step"] >= 0)].reset_index(drop=True)
    if calls.empty:
        raise TraceError(f"{trace.path}: no all-reduce calls inside steps: nothing to model")
    if calls["bytes"].isna().all():
        raise TraceError(
            f"{trace.path}: the collectives carry no byte counts (no payload on their comm ranges, no bucket "
            "layout in ddp.meta): the cost of other bucket sizes cannot be fitted; record with this "
            "project's run_nsys.sh"
        )
    world = world_size(trace.meta, len(trace.ranks))
    served = transfer_times(calls, world)
    if served.empty:
        raise TraceError(f"{trace.path}: no collective seen on every rank ({world}): give every rank's file (--merge)")
    cost = fit_cost(served["bytes"], served["transfer_ns"])
    ready_col = "start_ns" if calls_found.source == KERNELS else "issue_ns"
    calls = calls.assign(ready=calls[ready_col])
    per_step = measure_trace(trace, patterns, works)[0]
    windows = _backward_windows(works)
    ranks = trace.ranks["rank"].nunique()

    # the measured side, per rank-step: step, exposed, compute, tail after backward, comm under backward
    end = calls.groupby(["rank", "step"])["end_ns"].max().rename("comm_end").reset_index()
    transfer = (served.groupby(["rank", "step"])["transfer_ns"].sum() / NS_PER_MS).rename("transfer_ms").reset_index()
    end = end.merge(transfer, on=["rank", "step"], how="left").fillna({"transfer_ms": 0.0})
    inflight = pd.DataFrame(
        {"rank": served["rank"], "start": served["end_ns"] - served["transfer_ns"], "end": served["end_ns"]}
    )
    base = per_step[["rank", "step", "step_ms", "exposed_comm_ms", "compute_ms"]].merge(windows, on=["rank", "step"])
    base = base.merge(end, on=["rank", "step"])
    if kind == "param":
        order_step = calls[calls["step"] == calls["step"].min()]
        order = order_step[order_step["rank"] == order_step["rank"].min()].sort_values("ready")["tag"].tolist()
        table = calls.pivot_table(index=["step", "rank"], columns="tag", values="ready", aggfunc="min")
        sizes_tab = calls.groupby("tag")["bytes"].median()
        sizes = sizes_tab.reindex(order).to_numpy(dtype=float) - flags
        tags = order
    else:
        tags = sorted(calls["tag"].unique(), key=lambda t: (len(t), t))  # bucket0, bucket1, ..., bucket10
        table = calls.pivot_table(index=["step", "rank"], columns="tag", values="ready", aggfunc="min")
    table = table.reindex(columns=tags)
    table.columns = [f"ready:{t}" for t in tags]
    base = base.merge(table.reset_index(), on=["step", "rank"])
    base = _complete(base, ranks)
    if base.empty:
        raise TraceError(f"{trace.path}: no step where every rank has every collective and a backward pass")
    under = _under_backward(inflight, base)
    steps, n_ranks = base["step"].nunique(), ranks

    def grid(values: np.ndarray) -> np.ndarray:
        return np.asarray(values, dtype=float).reshape(steps, n_ranks, *np.shape(values)[1:])

    b0, b1 = grid(base["backward_start"].to_numpy()), grid(base["backward_end"].to_numpy())
    ready_cols = grid(base[[f"ready:{t}" for t in tags]].to_numpy(dtype=float))
    if kind == "param":
        ready = ready_cols
    else:
        members, payload = _bucket_members(trace, tags)
        sizes = _param_bytes(trace, members, payload, flags)
        starts = np.cumsum([0, *map(len, members)])
        idx = [np.arange(starts[i], starts[i + 1]) for i in range(len(members))]
        ready = place_in_buckets(ready_cols, idx, sizes, b0)
    tail = np.maximum(grid(base["comm_end"].to_numpy()) - b1, 0.0)
    under_b = grid(under)
    run = RecordedRun(
        step_ns=grid(base["step_ms"].to_numpy() * NS_PER_MS),
        backward_start=b0,
        backward_end=b1,
        tail_ns=tail,
        comm_under_backward_ns=under_b,
        ready=ready,
        param_bytes=np.asarray(sizes, dtype=float),
        flag_bytes=flags,
        slowdown=fit_slowdown(b1 - b0, under_b),
    )
    return run, base, cost


def _under_backward(segments: pd.DataFrame, base: pd.DataFrame) -> np.ndarray:
    """For each row of base (rank, backward_start, backward_end): transfer time inside its backward window."""
    m = base[["rank", "backward_start", "backward_end"]].reset_index().merge(segments, on="rank")
    s = np.clip(m["start"], m["backward_start"], m["backward_end"])
    e = np.clip(m["end"], m["backward_start"], m["backward_end"])
    inside = (e - s).groupby(m["index"]).sum()
    return inside.reindex(range(len(base)), fill_value=0.0).to_numpy(dtype=float)


def advise_trace(trace: Trace, bucket_mb: Iterable[float] | None = None, patterns: Patterns | None = None) -> Advice:
    """Predictions for one loaded trace at each bucket size (default DEFAULT_BUCKETS_MB and the recorded one)."""
    impl = _implementation(trace)
    run, base, cost = recorded_run(trace, patterns)
    meta = run_meta(trace)
    recorded = meta.get("bucket_mb") if impl != "overlap" else None
    recorded = float(recorded) if isinstance(recorded, (int, float)) else None
    sizes = sorted({*(bucket_mb or DEFAULT_BUCKETS_MB), *([recorded] if recorded and not bucket_mb else [])})
    rule = STRATEGIES[impl][1]
    candidates = []
    for mb in sizes:  # one replay per candidate size
        buckets = plan_buckets(run.param_bytes, mb, rule)
        r = replay(run, buckets, cost)
        candidates.append(
            Candidate(mb, len(buckets), float(r.step_ns.mean() / NS_PER_MS), float(r.tail_ns.mean() / NS_PER_MS))
        )
    measured = float(base["step_ms"].mean())
    exposed = float(base["exposed_comm_ms"].mean())
    slowdown_ms = run.slowdown * run.comm_under_backward_ns.mean() / NS_PER_MS
    compute = float(base["compute_ms"].mean()) - slowdown_ms
    return Advice(
        implementation=impl,
        trace=trace.path,
        recorded_bucket_mb=recorded,
        steps=len(base),
        measured_step_ms=measured,
        measured_exposed_comm_ms=exposed,
        ideal_step_ms=measured - exposed,
        floor_step_ms=max(compute, float(base["transfer_ms"].mean())),
        slowdown=run.slowdown,
        cost=cost,
        candidates=candidates,
    )


def advise(
    paths: str | Path | Iterable[str | Path],
    bucket_mb: Iterable[float] | None = None,
    merge: bool = False,
    patterns: Patterns | None = None,
) -> list[Advice]:
    """One Advice per run (runs.find_runs: the CLIs' rule; merge=True: all paths one run's per-rank files)."""
    return [advise_trace(load_trace(run.paths, patterns), bucket_mb, patterns) for run in find_runs(paths, merge)]
