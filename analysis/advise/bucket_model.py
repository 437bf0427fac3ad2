"""Replaying a run's backward pass with other buckets: when the step would end at another bucket size.

Arrays are shaped (steps, ranks, ...), times int-like ns on the trace's clock. For a candidate layout
(bucket_layout.plan_buckets) the model
  1. makes each bucket ready when its last gradient is ready, and launches buckets in order (a bucket
     waits for the ones before it, as both strategies launch them);
  2. runs the collectives one after another on the communication stream: collective k of a step
     starts when every rank has launched it and collective k-1 has ended, and lasts cost(bytes)
     (comm_cost.CommCost);
  3. stretches the backward pass by `slowdown` ms per ms of communication in flight under it (compute
     runs slower while communication runs; the recorded run's own stretch is taken out first);
  4. predicts the step as the recorded step with its backward pass and its wait for communication
     after backward (the tail) replaced by the replayed ones.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from analysis.advise.comm_cost import CommCost


@dataclass(frozen=True)
class RecordedRun:
    """What the model needs from one run: per step and rank (S, R) the step's length, the backward
    compute window [backward_start, backward_end), the recorded tail (communication after backward
    ended) and communication in flight under backward; per parameter (J), in arrival order, its
    gradient bytes and ready time (S, R, J)."""

    step_ns: np.ndarray
    backward_start: np.ndarray
    backward_end: np.ndarray
    tail_ns: np.ndarray
    comm_under_backward_ns: np.ndarray
    ready: np.ndarray
    param_bytes: np.ndarray
    flag_bytes: int  # extra bytes per parameter in each collective (the "had a gradient" flags)
    slowdown: float | np.ndarray  # extra compute ns per ns of communication in flight under it (or per step, (S, 1))


@dataclass(frozen=True)
class Replay:
    """The replayed collectives (S, K) and, per step and rank (S, R), the predicted figures."""

    comm_start: np.ndarray
    comm_end: np.ndarray
    comm_under_backward_ns: np.ndarray
    backward_ns: np.ndarray
    tail_ns: np.ndarray
    step_ns: np.ndarray


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


def serial_collectives(launch: np.ndarray, cost_ns: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(start, end), each (S, K): collective k starts once every rank launched it (launch: S, R, K)
    and collective k-1 ended, and lasts cost_ns[k] (or cost_ns[s, k], one cost per step)."""
    arrive = launch.max(axis=1)
    cost_ns = np.broadcast_to(np.asarray(cost_ns, dtype=float), arrive.shape)
    start, end = np.zeros_like(arrive, dtype=float), np.zeros_like(arrive, dtype=float)
    previous = np.full(arrive.shape[0], -np.inf)
    for k in range(arrive.shape[1]):  # one pass per bucket
        start[:, k] = np.maximum(arrive[:, k], previous)
        end[:, k] = start[:, k] + cost_ns[:, k]
        previous = end[:, k]
    return start, end


def under(start: np.ndarray, end: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Per (S, R): the length of disjoint intervals (S, K) inside [lo, hi) (S, R)."""
    s = np.clip(start[:, None, :], lo[:, :, None], hi[:, :, None])
    e = np.clip(end[:, None, :], lo[:, :, None], hi[:, :, None])
    return (e - s).sum(axis=2)


def bucket_bytes(run: RecordedRun, buckets: list[np.ndarray]) -> np.ndarray:
    """Each bucket's payload: its parameters' gradient bytes and their flags."""
    return np.array([run.param_bytes[b].sum() + run.flag_bytes * len(b) for b in buckets], dtype=float)


def replay(run: RecordedRun, buckets: list[np.ndarray], cost: CommCost | np.ndarray) -> Replay:
    """The model's figures for the run with the given buckets (index arrays over its parameters); the
    calls' cost from the fitted line, or given per bucket (K) or per step and bucket (S, K)."""
    nbytes = bucket_bytes(run, buckets)
    cost_ns = cost.predict_ns(nbytes) if isinstance(cost, CommCost) else np.asarray(cost, dtype=float)
    bucket_ready = np.stack([run.ready[:, :, b].max(axis=2) for b in buckets], axis=2)
    launch = np.maximum.accumulate(bucket_ready, axis=2)  # in order: a bucket waits for earlier ones
    start, end = serial_collectives(launch, cost_ns)
    b0, b1 = run.backward_start.astype(float), run.backward_end.astype(float)
    under_backward = under(start, end, b0, b1)
    own_compute = (b1 - b0) - run.slowdown * run.comm_under_backward_ns
    backward = own_compute + run.slowdown * under_backward
    tail = np.maximum(end[:, -1][:, None] - (b0 + backward), 0.0)
    step = run.step_ns - (b1 - b0) - run.tail_ns + backward + tail
    return Replay(start, end, under_backward, backward, tail, step)


def fit_slowdown(backward_ns: ArrayLike, comm_under_ns: ArrayLike, min_points: int = 4) -> float:
    """Extra compute per unit of communication in flight: the least-squares slope of the backward
    pass's length on the communication under it over the run's steps and ranks, clamped to [0, 1] (at 1
    compute stops while communication runs; more cannot be);
    0 with fewer than `min_points` points or no spread in the communication."""
    x, y = np.asarray(comm_under_ns, dtype=float).ravel(), np.asarray(backward_ns, dtype=float).ravel()
    keep = ~(np.isnan(x) | np.isnan(y))
    x, y = x[keep], y[keep]
    if x.size < min_points or np.ptp(x) <= 0:
        return 0.0
    slope = float(np.polyfit(x, y, 1)[0])
    return float(np.clip(slope, 0.0, 1.0))
