"""How much compute slows while communication runs: the estimates the replays take it from.

`backward_slope` (bucket replay, CPU ranges): the slope of the backward pass's length on the communication
in flight under it, over the run's steps and ranks, instrumented as `instrumented_slope` is. A plain
least-squares slope read a backward pass made long by anything else (the host's load) as a slowdown: a
longer pass has more of the step's communication under it. It gave 1.0, the clamp, on 7 of 12 CPU
recordings, where the instrumented slope gives 0-0.37 (docs/measurements/2026-11-29-advise-crossval-cpu-4.md).

`instrumented_slope` (sharded replay): the slope of each compute span's length on the communication beside
it, each unit's own mean taken out, instrumented by the communication beside the unit's typical span.

`step_sums` and `progress_slowdown` (bucket replay, GPU kernels): on a GPU the backward pass's kernels and
the NCCL kernels compete for the same SMs (more so when ranks share a GPU): compute can stall while a
collective runs, or run slower beside it. Both show as lost compute *progress*. Each compute kernel's work
is the median duration of its name's kernels that ran with no communication of their rank in flight; a
kernel that overlapped communication by a fraction f of its duration did f of its work under
communication. Per rank and step, over the backward window:

    rate_in  = work done under communication / communication in flight under backward
    rate_out = work done without communication / (backward window - communication in flight)
    slowdown = 1 - rate_in / rate_out      (0: compute kept its pace; 1: it stopped), clamped to [0, 1]

pooled over the rank-steps given (the sums, not a mean of ratios, so a step with little communication
does not weigh as much as one with a lot). The per rank-step sums are returned so that callers can
pool any subset of steps (the bootstrap's resamples).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike

from analysis.measure import intervals as iv

SUMS = ["work_in", "work_out", "comm_ns", "span_ns"]  # step_sums' columns


def backward_slope(backward_ns: ArrayLike, comm_under_ns: ArrayLike, typical_ns: ArrayLike) -> float:
    """Extra compute per unit of communication in flight: the backward pass's length on the communication
    under it over the run's steps and ranks, instrumented by the communication in flight during the pass's
    first median length (typical_ns): instrumented_slope with the whole pass as one unit."""
    y, x, z = (np.asarray(a, dtype=float).ravel() for a in (backward_ns, comm_under_ns, typical_ns))
    return instrumented_slope(y, x, z, np.zeros(y.size, dtype=int))


def instrumented_slope(
    span_ns: np.ndarray, beside_ns: np.ndarray, typical_ns: np.ndarray, unit: np.ndarray, min_points: int = 4
) -> float:
    """Extra compute ns per ns of communication beside it, from the compute spans of every rank-step,
    each unit's own mean taken out: the slope of span length on the communication beside the span,
    instrumented by the communication beside the unit's typical (median) span from the same start
    (sum dz.dy / sum dz.dx): a span made long by anything else has more communication beside it, the
    typical window does not grow with it. Clamped to [0, 0.95]; 0 with fewer than `min_points` spans
    or no spread."""
    y, x, z = (np.asarray(a, dtype=float) for a in (span_ns, beside_ns, typical_ns))
    keep = ~(np.isnan(x) | np.isnan(y) | np.isnan(z))
    y, x, z, unit = y[keep], x[keep], z[keep], np.asarray(unit)[keep]
    if y.size < min_points:
        return 0.0
    _, inverse, counts = np.unique(unit, return_inverse=True, return_counts=True)
    mean = lambda a: np.bincount(inverse, weights=a) / counts
    dx, dy, dz = x - mean(x)[inverse], y - mean(y)[inverse], z - mean(z)[inverse]
    denominator = float(np.dot(dz, dx))
    if denominator <= 0:
        return 0.0
    return float(np.clip(np.dot(dz, dy) / denominator, 0.0, 0.95))


def step_sums(kernels: pd.DataFrame, comm: pd.DataFrame, windows: pd.DataFrame) -> pd.DataFrame:
    """rank, step and SUMS per backward window.

    kernels: rank, name, start, end (compute kernels); comm: rank, start, end (the rank's communication
    kernels); windows: rank, step, lo, hi (each rank-step's backward window). A kernel belongs to the
    window its start lies in."""
    rows = []
    for rank, wins in windows.groupby("rank", sort=False):  # one pass per rank (a handful)
        own = comm[comm["rank"] == rank]
        set_s, set_e = iv.union(own["start"].to_numpy(), own["end"].to_numpy())
        k = kernels[kernels["rank"] == rank]
        lo, hi = wins["lo"].to_numpy(np.int64), wins["hi"].to_numpy(np.int64)
        order = np.argsort(lo)
        lo, hi, steps = lo[order], hi[order], wins["step"].to_numpy()[order]
        start, end = k["start"].to_numpy(np.int64), k["end"].to_numpy(np.int64)
        i = np.searchsorted(lo, start, side="right") - 1
        inside = (i >= 0) & (start < hi[np.maximum(i, 0)])
        f = pd.DataFrame(
            {
                "window": i[inside],
                "name": k["name"].astype(str).to_numpy()[inside],
                "dur": (end - start)[inside].astype(float),
                "over": iv.overlap_lengths(start[inside], end[inside], set_s, set_e).astype(float),
            }
        )
        comm_in = iv.overlap_lengths(lo, hi, set_s, set_e).astype(float)
        rows.append((rank, steps, f, comm_in, (hi - lo).astype(float)))
    frames = [f.assign(rank=r) for r, _, f, _, _ in rows]
    every = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=["name", "dur", "over"])
    alone = every[every["over"] <= 0].groupby("name")["dur"].median()
    out = []
    for rank, steps, f, comm_in, span in rows:
        work = f["name"].map(alone).fillna(f["dur"]).to_numpy(dtype=float)  # never alone: its own length
        share = np.divide(f["over"].to_numpy(), f["dur"].to_numpy(), out=np.zeros(len(f)), where=f["dur"] > 0)
        n = len(steps)
        w = f["window"].to_numpy()
        work_in = np.bincount(w, weights=work * share, minlength=n)
        work_out = np.bincount(w, weights=work * (1 - share), minlength=n)
        out.append(
            pd.DataFrame(
                {
                    "rank": rank,
                    "step": steps,
                    "work_in": work_in,
                    "work_out": work_out,
                    "comm_ns": comm_in,
                    "span_ns": span,
                }
            )
        )
    return pd.concat(out, ignore_index=True) if out else pd.DataFrame(columns=["rank", "step", *SUMS])


def progress_slowdown(work_in: float, work_out: float, comm_ns: float, span_ns: float) -> float:
    """1 - (progress rate under communication) / (progress rate without), clamped to [0, 1]; 0 when
    there was no communication (or no time without it) to compare."""
    if comm_ns <= 0 or span_ns - comm_ns <= 0 or work_out <= 0:
        return 0.0
    rate_in, rate_out = work_in / comm_ns, work_out / (span_ns - comm_ns)
    return float(np.clip(1.0 - rate_in / rate_out, 0.0, 1.0))
