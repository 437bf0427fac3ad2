"""Replaying a run's backward pass with other buckets on CPU ranges: when the step would end at another size.

Arrays are shaped (steps, ranks, ...), times int-like ns on the trace's clock. For a candidate layout
(contract.buckets.plan_buckets) the model
  1. makes each bucket ready when its last gradient is ready, and launches buckets in order (a bucket
     waits for the ones before it, as both strategies launch them);
  2. runs the collectives one after another on the communicator (communicator.serial_collectives):
     collective k of a step starts when every rank has launched it and collective k-1 has ended, and
     lasts cost(bytes) (comm_cost.CommCost);
  3. stretches the backward pass by `slowdown` ms per ms of communication in flight under it (compute
     runs slower while communication runs; the recorded run's own stretch is taken out first);
  4. adds the host's time per call's issue (call_cost.py; on CPU the host is the compute) once per call
     more than recorded to backward, and to every gradient's ready time once per call more before it;
  5. predicts the step as the recorded step with its backward pass and its wait for communication
     after backward (the tail) replaced by the replayed ones.
The GPU variant, where compute stalls beside the rank's own kernels, is buckets/gpu.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from analysis.advise.comm_cost import CommCost
from analysis.advise.communicator import serial_collectives


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
    recorded_last: np.ndarray | None = None  # each recorded call's last parameter (arrival index); None: one each
    host_ns: float | np.ndarray = 0.0  # host time per call's issue (call_cost.py), per rank (R,) or one for all
    comm_under_typical_ns: np.ndarray | None = None  # (S, R) in flight in backward's first median length (CPU)


def calls_before(last: np.ndarray, params: int) -> np.ndarray:
    """Per parameter (J,): how many calls (each given by its last parameter's arrival index) are issued before
    its gradient is ready."""
    return np.searchsorted(np.sort(np.asarray(last)), np.arange(params), side="left")


def recorded_calls_before(run: RecordedRun) -> np.ndarray:
    """calls_before of the recorded calls (per-parameter runs: one call per parameter)."""
    params = len(run.param_bytes)
    last = np.arange(params) if run.recorded_last is None else run.recorded_last
    return calls_before(last, params)


@dataclass(frozen=True)
class Replay:
    """The replayed collectives (S, K) and, per step and rank (S, R), the predicted figures."""

    comm_start: np.ndarray
    comm_end: np.ndarray
    comm_under_backward_ns: np.ndarray
    backward_ns: np.ndarray
    tail_ns: np.ndarray
    step_ns: np.ndarray


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
    # each call's issue takes the host `host_ns`: a call more (fewer) than recorded before a gradient makes it
    # that much later (sooner), and backward that much longer (shorter)
    host = np.broadcast_to(np.asarray(run.host_ns, dtype=float), run.step_ns.shape[1:])[None, :]
    moved = calls_before(np.array([b.max() for b in buckets]), run.ready.shape[2]) - recorded_calls_before(run)
    ready = run.ready + host[:, :, None] * moved[None, None, :]
    recorded_calls = run.ready.shape[2] if run.recorded_last is None else len(run.recorded_last)
    bucket_ready = np.stack([ready[:, :, b].max(axis=2) for b in buckets], axis=2)
    launch = np.maximum.accumulate(bucket_ready, axis=2)  # in order: a bucket waits for earlier ones
    start, end = serial_collectives(launch, cost_ns)
    b0, b1 = run.backward_start.astype(float), run.backward_end.astype(float)
    under_backward = under(start, end, b0, b1)
    own_compute = (b1 - b0) - run.slowdown * run.comm_under_backward_ns
    backward = own_compute + run.slowdown * under_backward + host * (len(buckets) - recorded_calls)
    tail = np.maximum(end[:, -1][:, None] - (b0 + backward), 0.0)
    step = run.step_ns - (b1 - b0) - run.tail_ns + backward + tail
    return Replay(start, end, under_backward, backward, tail, step)
