"""The bucket layout's inputs from one loaded run (`recorded_run`): per rank-step the measured figures,
the backward window, the tail and the communication under backward; per parameter its bytes and the time
its gradient was ready; the collective cost fitted on the run's own calls.

Gradient ready times: per-parameter runs (`overlap`) have one collective per parameter, issued when its
gradient arrived; bucketed runs (`overlap_bucket`, `torch`) have one per bucket, and the bucket's
parameters (from `ddp.meta`'s bucket layout) are placed by size in their arrival order between the
previous bucket's issue and their own. On GPU traces a collective's time is its kernel's, and the GPU
inputs (gpu.py) come with the run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike

from analysis.advise.buckets.gpu import GpuRun, gpu_run
from analysis.advise.buckets.replay import RecordedRun
from analysis.advise.call_cost import CallCost, call_cost
from analysis.advise.comm_cost import CommCost, fit_cost, transfer_times
from analysis.advise.recorded import STRATEGIES, every_rank, run_meta
from analysis.errors import TraceError
from analysis.measure.call_groups import world_size
from analysis.measure.rank_periods import backward_windows
from analysis.overlap.metrics import measure_trace
from analysis.run.loaded_run import LoadedRun
from analysis.trace.frames import KERNELS, NS_PER_MS, Trace

FLAG_BYTES = 4  # every wrapper but `torch` sends a 4-byte "had a gradient" flag per parameter


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


@dataclass(frozen=True)
class Recorded:
    """The model's inputs from one loaded trace: the run, its rank-steps' measured figures (`base`, sorted
    by step then rank), the cost fitted on all of its calls, the calls' transfers (`served`) and, when its
    collectives are GPU kernels, the GPU inputs."""

    run: RecordedRun
    base: pd.DataFrame
    cost: CommCost
    served: pd.DataFrame
    gpu: GpuRun | None
    call: CallCost  # the host time per collective issue (call_cost.py)


def recorded_run(loaded: LoadedRun, impl: str) -> Recorded:
    """The model's inputs from a loaded run of `impl` (one of layouts.STRATEGIES)."""
    trace, patterns, works = loaded.trace, loaded.patterns, loaded.works
    kind, _ = STRATEGIES[impl]
    flags = 0 if impl == "torch" else FLAG_BYTES
    calls_found = loaded.calls
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
    windows = backward_windows(works).rename(columns={"start": "backward_start", "end": "backward_end"})
    ranks = trace.ranks["rank"].nunique()

    # the measured side, per rank-step: step, exposed, compute, tail after backward, comm under backward
    end = calls.groupby(["rank", "step"])["end_ns"].max().rename("comm_end").reset_index()
    transfer = (served.groupby(["rank", "step"])["transfer_ns"].sum() / NS_PER_MS).rename("transfer_ms").reset_index()
    end = end.merge(transfer, on=["rank", "step"], how="left").fillna({"transfer_ms": 0.0})
    inflight = pd.DataFrame(
        {"rank": served["rank"], "start": served["end_ns"] - served["transfer_ns"], "end": served["end_ns"]}
    )
    keep = ["rank", "step", "step_ms", "exposed_comm_ms", "compute_ms", "backward_overlap_ms"]
    base = per_step[keep].merge(windows, on=["rank", "step"])
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
    base = every_rank(base.dropna(), ranks)
    if base.empty:
        raise TraceError(f"{trace.path}: no step where every rank has every collective and a backward pass")
    under = _under_backward(inflight, base)
    length = base["backward_end"] - base["backward_start"]
    typical = _under_backward(inflight, base.assign(backward_end=base["backward_start"] + length.median()))
    steps, n_ranks = base["step"].nunique(), ranks

    def grid(values: np.ndarray) -> np.ndarray:
        return np.asarray(values, dtype=float).reshape(steps, n_ranks, *np.shape(values)[1:])

    b0, b1 = grid(base["backward_start"].to_numpy()), grid(base["backward_end"].to_numpy())
    ready_cols = grid(base[[f"ready:{t}" for t in tags]].to_numpy(dtype=float))
    last = None
    if kind == "param":
        ready = ready_cols
    else:
        members, payload = _bucket_members(trace, tags)
        sizes = _param_bytes(trace, members, payload, flags)
        starts = np.cumsum([0, *map(len, members)])
        idx = [np.arange(starts[i], starts[i + 1]) for i in range(len(members))]
        ready = place_in_buckets(ready_cols, idx, sizes, b0)
        last = starts[1:] - 1
    tail = np.maximum(grid(base["comm_end"].to_numpy()) - b1, 0.0)
    under_b, typical_b = grid(under), grid(typical)
    on_gpu = calls_found.source == KERNELS
    per_call = call_cost(trace, calls, list(base["rank"].to_numpy()[:n_ranks]), on_gpu)
    run = RecordedRun(
        step_ns=grid(base["step_ms"].to_numpy() * NS_PER_MS),
        backward_start=b0,
        backward_end=b1,
        tail_ns=tail,
        comm_under_backward_ns=under_b,
        ready=ready,
        param_bytes=np.asarray(sizes, dtype=float),
        flag_bytes=flags,
        slowdown=0.0,  # fitted per bootstrap row by predict.fit (CPU: cpu_slowdown; GPU: the kernels' lost progress)
        recorded_last=last,
        host_ns=0.0 if on_gpu else per_call.host_ns,  # on CPU the host is the compute: each issue adds to backward
        comm_under_typical_ns=typical_b,
    )
    gpu = gpu_run(trace, run, base, served, per_call.host_ns) if on_gpu else None
    return Recorded(run, base, cost, served, gpu, per_call)


def _under_backward(segments: pd.DataFrame, base: pd.DataFrame) -> np.ndarray:
    """For each row of base (rank, backward_start, backward_end): transfer time inside its backward window."""
    m = base[["rank", "backward_start", "backward_end"]].reset_index().merge(segments, on="rank")
    s = np.clip(m["start"], m["backward_start"], m["backward_end"])
    e = np.clip(m["end"], m["backward_start"], m["backward_end"])
    inside = (e - s).groupby(m["index"]).sum()
    return inside.reindex(range(len(base)), fill_value=0.0).to_numpy(dtype=float)


def place_in_buckets(
    bucket_ready: np.ndarray, members: list[np.ndarray], param_bytes: ArrayLike, start: np.ndarray
) -> np.ndarray:
    """Ready times (S, R, J) of parameters known only by their bucket's ready time (S, R, K).

    A bucket's parameters (in arrival order) become ready one after another between the previous
    bucket's ready time (the first bucket: `start`, the backward pass's start) and their own bucket's,
    each after a share of that time proportional to its bytes; the last one at the bucket's time."""
    sizes = np.asarray(param_bytes, dtype=float)
    n_params = sum(len(m) for m in members)
    ready = np.zeros((*bucket_ready.shape[:2], n_params))
    previous = start.astype(float)
    for k, idx in enumerate(members):  # one pass per recorded bucket
        share = np.cumsum(sizes[idx]) / max(sizes[idx].sum(), 1.0)
        own = bucket_ready[:, :, k].astype(float)
        span = np.maximum(own - previous, 0.0)
        ready[:, :, idx] = previous[:, :, None] + span[:, :, None] * share[None, None, :]
        previous = np.maximum(previous, own)
    return ready
