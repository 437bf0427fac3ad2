"""The Python API behind `python -m analysis.advise`: `advise(paths, bucket_mb) -> list[Advice]`.

From one recorded run of a strategy that overlaps communication with backward (per-parameter `overlap`,
bucketed `overlap_bucket` or `torch`) it builds the model's inputs (advise/bucket_model.RecordedRun)
and predicts the step at each candidate bucket size. Gradient ready times: per-parameter runs have
one collective per parameter, issued when its gradient arrived; bucketed runs have one per bucket, and
the bucket's parameters (from `ddp.meta`'s bucket layout) are placed by size in their arrival order
between the previous bucket's issue and their own. On GPU traces a collective's time is its kernel's,
and the replay is the GPU one (advice_gpu.py: compute stalled by the rank's NCCL kernels, per-call waits);
on CPU traces, bucket_model.replay. Every prediction comes with its bootstrap interval (advice_predict.py)
and the recommendation keeps the recorded size unless a gain exceeds it (advice_result.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.advise.advice_gpu import GpuRun, gpu_run
from analysis.advise.advice_predict import fit, predictor, resamples
from analysis.advise.advice_result import Z95, Advice, Candidate, choose
from analysis.advise.bucket_layout import plan_buckets
from analysis.advise.bucket_model import RecordedRun, fit_slowdown, place_in_buckets
from analysis.advise.comm_cost import CommCost, fit_cost, transfer_times
from analysis.advise.sharded.shard_advice import advise_sharded
from analysis.advise.sharded.shard_recorded import SHARDED
from analysis.advise.sharded.shard_result import ShardAdvice
from analysis.api import open_runs
from analysis.errors import TraceError
from analysis.measure.pairing import world_size
from analysis.measure.rank_periods import backward_windows
from analysis.overlap.metrics import measure_trace
from analysis.run.loaded_run import LoadedRun
from analysis.trace.frames import KERNELS, NS_PER_MS, Trace
from analysis.trace.patterns import Patterns
from analysis.trace.readers.meta_peek import declared_implementations

DEFAULT_BUCKETS_MB = (1.0, 2.0, 5.0, 10.0, 25.0, 50.0, 100.0)
FLAG_BYTES = 4  # every wrapper but `torch` sends a 4-byte "had a gradient" flag per parameter
# implementation -> (kind of recorded collectives, bucket rule of the strategy that takes a bucket size)
STRATEGIES = {"overlap": ("param", "before"), "overlap_bucket": ("bucket", "before"), "torch": ("bucket", "after")}


def run_meta(trace: Trace) -> dict:
    """The first rank's `ddp.meta` (every rank records the same layout), or {}."""
    return next(iter(trace.meta.values()), {}) if trace.meta else {}


def _unsupported(path: str, impl: str) -> TraceError:
    return TraceError(
        f"{path}: implementation {impl}: advise predicts DDP's bucket size from a run of {', '.join(STRATEGIES)}, "
        f"and a sharded run's prefetch depth and reduce-scatter communicator from a run of {', '.join(SHARDED)}"
    )


def _implementation(trace: Trace) -> str:
    impl = trace.implementation or next((str(m.get("implementation")) for m in trace.meta.values()), "")
    if impl not in STRATEGIES:
        raise _unsupported(trace.path, impl or "unknown (no ddp.meta mark)")
    return impl


def _check_declared(paths: Sequence[Path]) -> None:
    """Refuse a run whose nsys exports declare only strategies advise does not model, before loading it."""
    for path in paths:
        declared = declared_implementations(path)
        if declared and not declared & {*STRATEGIES, *SHARDED}:
            raise _unsupported(str(path), ", ".join(sorted(declared)))


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


def recorded_run(loaded: LoadedRun) -> Recorded:
    """The model's inputs from a loaded run (Recorded)."""
    trace, patterns, works = loaded.trace, loaded.patterns, loaded.works
    impl = _implementation(trace)
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
    gpu = gpu_run(trace, run, base, served) if calls_found.source == KERNELS else None
    return Recorded(run, base, cost, served, gpu)


def _under_backward(segments: pd.DataFrame, base: pd.DataFrame) -> np.ndarray:
    """For each row of base (rank, backward_start, backward_end): transfer time inside its backward window."""
    m = base[["rank", "backward_start", "backward_end"]].reset_index().merge(segments, on="rank")
    s = np.clip(m["start"], m["backward_start"], m["backward_end"])
    e = np.clip(m["end"], m["backward_start"], m["backward_end"])
    inside = (e - s).groupby(m["index"]).sum()
    return inside.reindex(range(len(base)), fill_value=0.0).to_numpy(dtype=float)


def advise_trace(loaded: LoadedRun, bucket_mb: Iterable[float] | None = None) -> Advice:
    """Predictions for one loaded run at each bucket size (default DEFAULT_BUCKETS_MB and the recorded
    one), each with its uncertainty, and the recommendation (advice_result.choose)."""
    trace = loaded.trace
    impl = _implementation(trace)
    rec = recorded_run(loaded)
    run, base, gpu = rec.run, rec.base, rec.gpu
    meta = run_meta(trace)
    recorded = meta.get("bucket_mb") if impl != "overlap" else None
    recorded = float(recorded) if isinstance(recorded, (int, float)) else None
    sizes = sorted({*(bucket_mb or DEFAULT_BUCKETS_MB), *([recorded] if recorded else [])})
    steps = base["step"].unique()
    fitted = fit(run, rec.served, steps, gpu, resamples(len(steps)))
    under = run.comm_under_backward_ns if gpu is None else gpu.comm_under_ns
    overlapped = min(float(base["backward_overlap_ms"].sum() * NS_PER_MS / max(under.sum(), 1.0)), 1.0)
    exposed_ns = base["exposed_comm_ms"].to_numpy(dtype=float).reshape(run.step_ns.shape) * NS_PER_MS
    predict = predictor(run, fitted, gpu, exposed_ns, overlapped)
    rule = STRATEGIES[impl][1]
    step_rows, exposed_rows, counts = [], [], []
    for mb in sizes:  # one replay per candidate size (every bootstrap replicate at once)
        buckets = plan_buckets(run.param_bytes, mb, rule)
        step_ms, exposed_ms = predict(buckets)
        step_rows.append(step_ms)
        exposed_rows.append(exposed_ms)
        counts.append(len(buckets))
    steps_ms, exposed_all = np.stack(step_rows, axis=1), np.stack(exposed_rows, axis=1)
    err = lambda a: Z95 * a[1:].std(axis=0) if len(a) > 2 else np.zeros(a.shape[1])
    candidates = [
        Candidate(mb, n, float(s), float(e), float(se), float(ee))
        for mb, n, s, e, se, ee in zip(
            sizes, counts, steps_ms[0], exposed_all[0], err(steps_ms), err(exposed_all), strict=True
        )
    ]
    lam = float(fitted.slowdown[0])
    measured = float(base["step_ms"].mean())
    exposed = float(base["exposed_comm_ms"].mean())
    compute = float(base["compute_ms"].mean()) - lam * under.mean() / NS_PER_MS
    return Advice(
        implementation=impl,
        trace=trace.path,
        recorded_bucket_mb=recorded,
        steps=len(base),
        measured_step_ms=measured,
        measured_exposed_comm_ms=exposed,
        ideal_step_ms=measured - exposed,
        floor_step_ms=max(compute, float(base["transfer_ms"].mean())),
        slowdown=lam,
        cost=rec.cost,
        candidates=candidates,
        recommendation=choose(sizes, steps_ms, recorded),
        model="replay" if gpu is None else "stalls",
        slowdown_err=float(err(fitted.slowdown[:, None])[0]),
        call_wait_ms=None if gpu is None else float(fitted.wait_ns[0] / NS_PER_MS),
        replicates=len(fitted.rows) - 1,
    )


def advise(
    paths: str | Path | Iterable[str | Path],
    bucket_mb: Iterable[float] | None = None,
    merge: bool = False,
    patterns: Patterns | None = None,
    prefetch: Iterable[int] | None = None,
) -> list[Advice | ShardAdvice]:
    """One Advice per run (run_files.find_runs: the CLIs' rule; merge=True: all paths one run's per-rank files);
    sharded runs (fsdp, torch_fsdp) get a ShardAdvice (shard_advice.py: prefetch depths `prefetch`)."""
    # the one door: each run read once, in turn
    runs = open_runs(paths, merge=merge, patterns=patterns, keep_traces=False)
    for run in runs.runs:
        _check_declared(run.paths)
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
            out.append(advise_trace(loaded, bucket_mb))
    return out
