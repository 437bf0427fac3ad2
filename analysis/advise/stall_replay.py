"""Replaying one rank's backward pass with other buckets when communication slows its compute (GPU).

Time is counted from the start of backward's compute; arrays are (N, R, ...) for N replayed steps (a
step may appear several times: the bootstrap of advice.py) and R ranks. A rank's backward compute is
`compute_ns` of work; bucket k becomes ready when that work has reached `ready[..., k]` (work done,
not wall time, so that a candidate that stalls compute more also makes its later gradients later).
On the rank's one communication stream the calls run one after another: call k starts when it is ready
and call k-1 has ended, and stays in flight `call_ns[..., k]` (its transfer and its wait for the other
ranks). While a call is in flight compute runs at (1 - slowdown) of its pace; otherwise at full pace.
Backward ends when its work is done; the tail is what the calls run on after that.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Stalled:
    """Per replayed step and rank (N, R): backward's length, the tail after it, and the calls' time in
    flight before backward ended."""

    backward_ns: np.ndarray
    tail_ns: np.ndarray
    comm_under_ns: np.ndarray


def replay_stalls(ready: np.ndarray, compute_ns: np.ndarray, call_ns: np.ndarray, slowdown: np.ndarray) -> Stalled:
    """The module docstring's schedule; `slowdown` broadcasts against (N, R) (one per replayed step)."""
    work = np.asarray(compute_ns, dtype=float)
    ready = np.minimum(np.maximum.accumulate(np.asarray(ready, dtype=float), axis=-1), work[..., None])
    rate = np.broadcast_to(1.0 - np.clip(np.asarray(slowdown, dtype=float), 0.0, 1.0), work.shape)
    t, done_work = np.zeros_like(work), np.zeros_like(work)
    finished = np.full(work.shape, np.nan)  # wall time at which backward's work was done
    under = np.zeros_like(work)
    for k in range(ready.shape[-1]):  # one pass per bucket: each call waits for the one before it
        idle = np.maximum(ready[..., k] - done_work, 0.0)  # nothing in flight: compute at full pace
        t, done_work = t + idle, done_work + idle
        left = work - done_work
        finished = np.where(np.isnan(finished) & (left <= 0), t, finished)
        d = call_ns[..., k]
        to_finish = np.divide(left, rate, out=np.full(work.shape, np.inf), where=rate > 0)
        running = np.isnan(finished)
        under += np.where(running, np.minimum(d, to_finish), 0.0)
        finished = np.where(running & (to_finish <= d), t + to_finish, finished)
        done_work = np.minimum(done_work + rate * d, work)
        t = t + d
    finished = np.where(np.isnan(finished), t + (work - done_work), finished)
    return Stalled(finished, np.maximum(t - finished, 0.0), under)
