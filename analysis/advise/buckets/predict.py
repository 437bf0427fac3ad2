"""The bucket layout's predictions: each candidate bucket size's step and exposed communication, with their
uncertainty (uncertainty.py), and the recommendation, from one recorded run (recorded.py).

Every row of the bootstrap refits the model's parameters on its resample of the steps: the collective
cost (comm_cost.fit_cost), the compute slowdown (CPU: slowdown.backward_slope; GPU: the kernels' lost
progress) and, on GPU, the per-call wait; then every candidate is replayed with every row at once
(replay.py on CPU ranges, gpu.py on GPU kernels).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from analysis.advise.buckets.gpu import GpuRun, predict_gpu
from analysis.advise.buckets.recorded import recorded_run
from analysis.advise.buckets.replay import RecordedRun, bucket_bytes, replay
from analysis.advise.buckets.result import Advice, Candidate, ReplayCheck
from analysis.advise.comm_cost import CommCost, fit_cost
from analysis.advise.recorded import STRATEGIES, run_meta
from analysis.advise.slowdown import backward_slope
from analysis.advise.uncertainty import (
    choose,
    half_width,
    resampled_calls,
    resamples,
    row_means_ms,
    step_noise_ms,
    step_spread_ms,
)
from analysis.run.loaded_run import LoadedRun
from analysis.trace.frames import NS_PER_MS
from contract.buckets import FIRST_BUCKET_MB, MIB, plan_buckets

DEFAULT_BUCKETS_MB = (1.0, 2.0, 5.0, 10.0, 25.0, 50.0, 100.0)


@dataclass(frozen=True)
class Fitted:
    """The model's parameters per row (1 + B): the steps it was fitted on, the cost, slowdown and wait."""

    rows: np.ndarray  # (1 + B, S) indices of recorded steps
    costs: list[CommCost]
    slowdown: np.ndarray
    wait_ns: np.ndarray  # GPU: mean wait per call; CPU: 0


def fit(run: RecordedRun, served: pd.DataFrame, steps: np.ndarray, gpu: GpuRun | None, rows: np.ndarray) -> Fitted:
    """The parameters refitted on each row's steps (steps: the recorded step numbers, in S order)."""
    costs, lam, wait = [], [], []
    for pick, calls in zip(rows, resampled_calls(served, steps, rows), strict=True):  # each a small least-squares
        costs.append(fit_cost(calls["bytes"], calls["transfer_ns"]))
        if gpu is None:
            lam.append(cpu_slowdown(run, pick))
            wait.append(0.0)
        else:
            lam.append(gpu.slowdown(pick))
            wait.append(gpu.call_wait_ns(pick))
    return Fitted(rows, costs, np.asarray(lam), np.asarray(wait))


def cpu_slowdown(run: RecordedRun, pick: np.ndarray) -> float:
    """slowdown.backward_slope over the picked steps (indices into S, repeats allowed); raises ValueError
    for a run without comm_under_typical_ns (recorded.recorded_run gives every CPU run one)."""
    if run.comm_under_typical_ns is None:
        raise ValueError("the CPU slowdown needs the communication in flight in backward's typical window")
    length = run.backward_end[pick] - run.backward_start[pick]
    return backward_slope(length, run.comm_under_backward_ns[pick], run.comm_under_typical_ns[pick])


def _rows_of(run: RecordedRun, rows: np.ndarray, slowdown: np.ndarray) -> RecordedRun:
    return replace(
        run,
        step_ns=run.step_ns[rows],
        backward_start=run.backward_start[rows],
        backward_end=run.backward_end[rows],
        tail_ns=run.tail_ns[rows],
        comm_under_backward_ns=run.comm_under_backward_ns[rows],
        comm_under_typical_ns=None if run.comm_under_typical_ns is None else run.comm_under_typical_ns[rows],
        ready=run.ready[rows],
        slowdown=slowdown[:, None],
    )


def predictor(
    run: RecordedRun, fitted: Fitted, gpu: GpuRun | None, exposed_ns: np.ndarray, overlapped: float
) -> Callable[[list[np.ndarray]], tuple[np.ndarray, np.ndarray]]:
    """A function: buckets -> (step ms, exposed comm ms), each (1 + B): row 0 the estimate.

    exposed_ns (S, R): the recorded exposed communication; overlapped: the share of the communication
    in flight under backward that had compute beside it. The prediction moves the recorded exposed
    communication by the change in the tail and by the uncovered share of the change under backward."""
    n_rows, steps = fitted.rows.shape
    flat = fitted.rows.ravel()
    lam, wait = np.repeat(fitted.slowdown, steps), np.repeat(fitted.wait_ns, steps)
    sub = _rows_of(run, flat, lam)

    def predict(buckets: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        nbytes = bucket_bytes(run, buckets)
        cost_ns = np.repeat(np.stack([c.predict_ns(nbytes) for c in fitted.costs]), steps, axis=0)
        if gpu is None:
            r = replay(sub, buckets, cost_ns)
            step, d_comm, d_tail = (
                r.step_ns,
                r.comm_under_backward_ns - sub.comm_under_backward_ns,
                r.tail_ns - sub.tail_ns,
            )
        else:
            step, d_comm, d_tail = predict_gpu(gpu, run, flat, lam, wait, buckets, cost_ns)
        exposed = np.maximum(exposed_ns[flat] + (1.0 - overlapped) * d_comm + d_tail, 0.0)
        return row_means_ms(step, n_rows), row_means_ms(exposed, n_rows)

    return predict


def layouts(run: RecordedRun, sizes: list[float], rule: str) -> dict[tuple, list[float]]:
    """The distinct bucket layouts of the candidate sizes (contract.buckets.plan_buckets), each with the
    sizes that give it, smallest first: sizes past the model's whole gradient give the same buckets."""
    out: dict[tuple, list[float]] = {}
    for mb in sizes:
        planned = plan_buckets(run.param_bytes, mb * MIB, min(FIRST_BUCKET_MB, mb) * MIB, rule)
        out.setdefault(tuple(tuple(int(i) for i in b) for b in planned), []).append(mb)
    return out


def advise_buckets(loaded: LoadedRun, impl: str, bucket_mb: Iterable[float] | None = None) -> Advice:
    """Predictions for one loaded run of `impl` at each bucket size (default DEFAULT_BUCKETS_MB and the
    recorded one), each a change from the replay of the recorded layout with its uncertainty, and the
    recommendation (uncertainty.choose, over the distinct layouts)."""
    trace = loaded.trace
    rec = recorded_run(loaded, impl)
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
    groups = layouts(run, sizes, STRATEGIES[impl][1])
    # the recorded layout: the recorded size's buckets, or one collective per parameter (overlap)
    own_layout = next((k for k, v in groups.items() if recorded in v), None)
    own = own_layout or tuple((j,) for j in range(len(run.param_bytes)))
    own_step, own_exposed = predict([np.asarray(b, dtype=np.int64) for b in own])
    step_rows, exposed_rows = [], []
    for layout in groups:  # one replay per distinct layout (every bootstrap replicate at once)
        step_ms, exposed_ms = predict([np.asarray(b, dtype=np.int64) for b in layout])
        step_rows.append(step_ms)
        exposed_rows.append(exposed_ms)
    steps_ms, exposed_all = np.stack(step_rows, axis=1), np.stack(exposed_rows, axis=1)
    n_rows = len(fitted.rows)
    flat = fitted.rows.ravel()
    measured_rows = row_means_ms(run.step_ns[flat], n_rows)
    exposed_meas_rows = row_means_ms(exposed_ns[flat], n_rows)
    d_step = steps_ms - own_step[:, None]  # paired by row: what every layout shares cancels
    d_exposed = exposed_all - own_exposed[:, None]
    anchored = measured_rows[:, None] + d_step
    anchored_exposed = np.maximum(exposed_meas_rows[:, None] + d_exposed, 0.0)
    measured = float(base["step_ms"].mean())
    noise = step_noise_ms(run.step_ns)  # what the recorded mean step is known to: the keep rule's yardstick
    exposed = float(base["exposed_comm_ms"].mean())
    candidates = []
    for g, (layout, same) in enumerate(groups.items()):
        for mb in same:
            candidates.append(
                Candidate(
                    mb, len(layout), float(anchored[0, g]), float(anchored_exposed[0, g]),
                    float(half_width(anchored[:, g])), float(half_width(anchored_exposed[:, g])),
                    change_ms=float(d_step[0, g]), change_ms_err=float(half_width(d_step[:, g])),
                    change_pct=100.0 * float(d_step[0, g]) / measured,
                    change_pct_err=100.0 * float(half_width(d_step[:, g])) / measured,
                    same_layout_mb=tuple(same),
                )
            )  # fmt: skip
    # one setting per layout for the recommendation: the recorded size where its layout is one
    reps = [recorded if recorded in same else same[0] for same in groups.values()]
    lam = float(fitted.slowdown[0])
    compute = float(base["compute_ms"].mean()) - lam * under.mean() / NS_PER_MS
    ideal = measured - exposed
    return Advice(
        implementation=impl,
        trace=trace.path,
        recorded_bucket_mb=recorded,
        steps=len(base),
        measured_step_ms=measured,
        measured_exposed_comm_ms=exposed,
        ideal_step_ms=ideal,
        floor_step_ms=min(max(compute, float(base["transfer_ms"].mean())), ideal),  # never above what it bounds
        slowdown=lam,
        cost=rec.cost,
        candidates=candidates,
        recommendation=choose(reps, steps_ms, recorded, noise),
        model="replay" if gpu is None else "stalls",
        slowdown_err=float(half_width(fitted.slowdown)),
        call_wait_ms=None if gpu is None else float(fitted.wait_ns[0] / NS_PER_MS),
        replicates=len(fitted.rows) - 1,
        replayed=ReplayCheck(float(own_step[0]), float(half_width(own_step)), float(own_exposed[0]),
                          float(half_width(own_exposed))),
        step_spread_ms=step_spread_ms(run.step_ns),
        step_noise_ms=noise,
        call_host_ms=tuple(float(v) / NS_PER_MS for v in rec.call.host_ns),
        call_host_source=rec.call.source,
    )  # fmt: skip
