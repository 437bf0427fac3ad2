"""Every candidate's prediction with its uncertainty: the model refitted on bootstrap resamples of the
recorded steps.

Row 0 of every result is the estimate from all recorded steps; rows 1..B replay a resample of the steps
(drawn with replacement, fixed seed) with the model's parameters refitted on that resample alone: the
collective cost (comm_cost.fit_cost), the compute slowdown and, on GPU, the per-call wait. The spread of
the replicates is the uncertainty of each prediction (sampling noise of the recorded steps and of the
fitted parameters together); the replicates are paired across candidates, so differences between
candidates have their own, smaller, spread (advice_result.choose).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from analysis.advise.advice_gpu import GpuRun, predict_gpu
from analysis.advise.bucket_model import RecordedRun, bucket_bytes, fit_slowdown, replay
from analysis.advise.comm_cost import CommCost, fit_cost
from analysis.trace.frames import NS_PER_MS

REPLICATES = 200
SEED = 0


@dataclass(frozen=True)
class Fitted:
    """The model's parameters per row (1 + B): the steps it was fitted on, the cost, slowdown and wait."""

    rows: np.ndarray  # (1 + B, S) indices of recorded steps
    costs: list[CommCost]
    slowdown: np.ndarray
    wait_ns: np.ndarray  # GPU: mean wait per call; CPU: 0


def resamples(steps: int, replicates: int = REPLICATES, seed: int = SEED) -> np.ndarray:
    """(1 + replicates, steps): every step in order, then resamples with replacement."""
    draws = np.random.default_rng(seed).integers(0, steps, size=(replicates, steps))
    return np.vstack([np.arange(steps)[None, :], draws]) if steps > 1 else np.zeros((1, steps), dtype=np.int64)


def fit(run: RecordedRun, served: pd.DataFrame, steps: np.ndarray, gpu: GpuRun | None, rows: np.ndarray) -> Fitted:
    """The parameters refitted on each row's steps (steps: the recorded step numbers, in S order)."""
    by_step = [served[served["step"] == s] for s in steps]
    costs, lam, wait = [], [], []
    for pick in rows:  # one fit per replicate (a few hundred): each a small least-squares problem
        calls = pd.concat([by_step[i] for i in pick], ignore_index=True)
        costs.append(fit_cost(calls["bytes"], calls["transfer_ns"]))
        if gpu is None:
            lam.append(
                fit_slowdown(run.backward_end[pick] - run.backward_start[pick], run.comm_under_backward_ns[pick])
            )
            wait.append(0.0)
        else:
            lam.append(gpu.slowdown(pick))
            wait.append(gpu.call_wait_ns(pick))
    return Fitted(rows, costs, np.asarray(lam), np.asarray(wait))


def _rows_of(run: RecordedRun, rows: np.ndarray, slowdown: np.ndarray) -> RecordedRun:
    return replace(
        run,
        step_ns=run.step_ns[rows],
        backward_start=run.backward_start[rows],
        backward_end=run.backward_end[rows],
        tail_ns=run.tail_ns[rows],
        comm_under_backward_ns=run.comm_under_backward_ns[rows],
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
        per_row = lambda a: a.reshape(n_rows, -1).mean(axis=1) / NS_PER_MS
        return per_row(step), per_row(exposed)

    return predict
