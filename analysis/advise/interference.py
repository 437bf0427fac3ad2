"""How much a rank's backward compute loses while its own communication kernels are in flight (GPU).

On a GPU the backward pass's kernels and the NCCL kernels compete for the same SMs (more so when ranks
share a GPU): compute can stall while a collective runs, or run slower beside it. Both show as lost
compute *progress*. Each compute kernel's work is the median duration of its name's kernels that ran
with no communication of their rank in flight; a kernel that overlapped communication by a fraction f
of its duration did f of its work under communication. Per rank and step, over the backward window:

    rate_in  = work done under communication / communication in flight under backward
    rate_out = work done without communication / (backward window - communication in flight)
    slowdown = 1 - rate_in / rate_out      (0: compute kept its pace; 1: it stopped), clamped to [0, 1]

pooled over the rank-steps given (the sums, not a mean of ratios, so a step with little communication
does not weigh as much as one with a lot). The per rank-step sums are returned so that callers can
pool any subset of steps (the bootstrap of advice.py).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.measure import intervals as iv

SUMS = ["work_in", "work_out", "comm_ns", "span_ns"]


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


def slowdown(work_in: float, work_out: float, comm_ns: float, span_ns: float) -> float:
    """1 - (progress rate under communication) / (progress rate without), clamped to [0, 1]; 0 when
    there was no communication (or no time without it) to compare."""
    if comm_ns <= 0 or span_ns - comm_ns <= 0 or work_out <= 0:
        return 0.0
    rate_in, rate_out = work_in / comm_ns, work_out / (span_ns - comm_ns)
    return float(np.clip(1.0 - rate_in / rate_out, 0.0, 1.0))
