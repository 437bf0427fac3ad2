"""The bucket what-if on GPU kernels: compute stalls beside the rank's own communication kernels.

Inputs (`GpuRun`), per rank-step (S, R): the interference sums (slowdown.step_sums), the rank's
communication kernels in flight under backward, the first call's wait for the other ranks (the step's
start carries the ranks' skew, paid once a step at any bucket size) and the other calls' waits (paid once
a call); per parameter (S, R, J): the time from backward's start to its gradient's ready time and the
communication in flight before it, so that its ready time in *work done* can be taken for any slowdown.

The replay (`replay_stalls`), time counted from the start of backward's compute, arrays (N, R, ...) for N
replayed steps (a step may appear several times: the bootstrap) and R ranks: a rank's backward compute is
`compute_ns` of work; bucket k becomes ready when that work has reached `ready[..., k]` (work done, not
wall time, so that a candidate that stalls compute more also makes its later gradients later). On the
rank's one communication stream the calls run one after another: call k starts when it is ready and call
k-1 has ended, and stays in flight `call_ns[..., k]` (its transfer and its wait for the other ranks).
While a call is in flight compute runs at (1 - slowdown) of its pace; otherwise at full pace. Backward
ends when its work is done; the tail is what the calls run on after that.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from analysis.advise.buckets.replay import RecordedRun, calls_before, recorded_calls_before
from analysis.advise.slowdown import SUMS, progress_slowdown, step_sums
from analysis.measure import intervals as iv
from analysis.measure.phases import codes
from analysis.trace.frames import GPU_KERNEL, Trace


@dataclass(frozen=True)
class GpuRun:
    sums: np.ndarray  # (S, R, 4): work_in, work_out, comm_ns, span_ns (slowdown.SUMS)
    elapsed: np.ndarray  # (S, R, J) ready time - backward start
    comm_before: np.ndarray  # (S, R, J) own communication in flight between backward start and ready time
    first_wait_ns: np.ndarray  # (S, R)
    wait_ns: np.ndarray  # (S, R) the other calls' waits, summed
    wait_calls: np.ndarray  # (S, R) how many calls those are
    starved_ns: np.ndarray  # (S, R) compute idle under backward waiting for the host to launch its next kernel
    starved_before: np.ndarray  # (S, R, J) of it, between backward start and each gradient's ready time
    starved_comm_ns: np.ndarray  # (S, R) the part of it with a collective of the rank in flight
    starved_comm_before: np.ndarray  # (S, R, J)
    slack_ns: np.ndarray  # (S, R) how far ahead of the GPU the host was at backward's last kernel (its queue wait)
    lead_at: np.ndarray  # (S, R, J) how far ahead the host was when each gradient was ready
    host_ns: np.ndarray  # (R,) host time per collective issue (call_cost.py)

    @property
    def comm_under_ns(self) -> np.ndarray:
        return self.sums[..., 2]

    def slowdown(self, rows: np.ndarray) -> float:
        """slowdown.progress_slowdown pooled over the given steps (indices into S, repeats allowed)."""
        return progress_slowdown(*self.sums[rows].reshape(-1, len(SUMS)).sum(axis=0))

    def call_wait_ns(self, rows: np.ndarray) -> float:
        """Mean wait for the other ranks per call, the step's first call aside, over the given steps."""
        calls = self.wait_calls[rows].sum()
        return float(self.wait_ns[rows].sum() / calls) if calls else 0.0


def _grid(base: pd.DataFrame, frame: pd.DataFrame, cols: list[str], shape: tuple[int, int]) -> np.ndarray:
    """frame's cols on base's (step, rank) rows, (S, R, len(cols)); 0 where frame has no row."""
    merged = base[["step", "rank"]].merge(frame, on=["step", "rank"], how="left")[cols].fillna(0.0)
    return merged.to_numpy(dtype=float).reshape(*shape, len(cols))


def _covered(set_starts: np.ndarray, set_ends: np.ndarray, t: np.ndarray) -> np.ndarray:
    """iv.covered_before for an array of times of any shape."""
    return iv.covered_before(set_starts, set_ends, np.asarray(t, dtype=np.int64).ravel()).reshape(np.shape(t))


def gpu_run(trace: Trace, run: RecordedRun, base: pd.DataFrame, served: pd.DataFrame, host_ns: np.ndarray) -> GpuRun:
    """The GPU inputs of a recorded run (base: its rank-steps sorted by step then rank, as in recorded.py;
    host_ns: each rank's host time per collective issue)."""
    shape = run.step_ns.shape
    ops = trace.gpu_ops
    ranks = trace.ranks[["part", "pid", "device", "rank"]]
    kernels = ops[codes(ops["kind"]) == GPU_KERNEL].merge(ranks, on=["part", "pid", "device"])
    comm = kernels[kernels["is_comm"]]
    windows = base[["rank", "step"]].assign(lo=base["backward_start"], hi=base["backward_end"])
    sums = _grid(base, step_sums(kernels[~kernels["is_comm"]], comm, windows), SUMS, shape)

    b0 = run.backward_start.astype(float)
    before = np.zeros_like(run.ready, dtype=float)
    for r in range(shape[1]):  # one pass per rank: its communication kernels as one interval set
        own = comm[comm["rank"] == base["rank"].to_numpy()[r]]
        s, e = iv.union(own["start"].to_numpy(), own["end"].to_numpy())
        before[:, r, :] = _covered(s, e, run.ready[:, r, :]) - _covered(s, e, b0[:, r])[:, None]

    calls = served[served["step"].isin(base["step"].unique())].sort_values(["rank", "step", "start_ns"])
    first = calls.groupby(["rank", "step"]).head(1)
    rest = calls.drop(first.index).groupby(["rank", "step"])["wait_ns"].agg(["sum", "size"]).reset_index()
    first_wait = _grid(base, first[["rank", "step", "wait_ns"]], ["wait_ns"], shape)[..., 0]
    waits = _grid(base, rest, ["sum", "size"], shape)
    starved, starved_before, starved_comm, starved_comm_before, slack, lead = _host_gaps(
        kernels[~kernels["is_comm"]], comm, base, run
    )
    return GpuRun(
        sums, run.ready - b0[..., None], before, first_wait, waits[..., 0], waits[..., 1], starved, starved_before,
        starved_comm, starved_comm_before, slack, lead, host_ns,
    )  # fmt: skip


def _host_gaps(
    compute: pd.DataFrame, comm: pd.DataFrame, base: pd.DataFrame, run: RecordedRun
) -> tuple[np.ndarray, ...]:
    """Per rank-step (S, R): the compute idle under backward spent waiting for the host (a kernel launched after
    the rank's previous compute kernel ended: the gap from that end to the launch) and the part of it with a
    collective of the rank in flight (which the stall model may claim), and the host's lead at
    backward's last kernel (its start - its launch); per gradient (S, R, J) both idles before its ready time and
    the host's lead at its ready time (of the last kernel started by then)."""
    b0, b1 = run.backward_start.astype(float), run.backward_end.astype(float)
    starved, starved_comm, slack = np.zeros_like(b0), np.zeros_like(b0), np.zeros_like(b0)
    before = np.zeros_like(run.ready, dtype=float)
    before_comm, lead = np.zeros_like(before), np.zeros_like(before)
    for r in range(b0.shape[1]):  # one pass per rank: its compute kernels in start order
        rank = base["rank"].to_numpy()[r]
        own = compute[compute["rank"] == rank].sort_values("start")
        mine = comm[comm["rank"] == rank]
        start, end = own["start"].to_numpy(float), own["end"].to_numpy(float)
        launch = np.minimum(own["launch_start"].to_numpy(float), start)
        prev_end = np.maximum.accumulate(np.r_[start[:1], end[:-1]])  # the first kernel: no gap before it
        idle = np.clip(launch - prev_end, 0.0, np.maximum(start - prev_end, 0.0))
        s, e = iv.union((start - idle).astype(np.int64), start.astype(np.int64))
        sc, ec = iv.intersect(s, e, *iv.union(mine["start"].to_numpy(), mine["end"].to_numpy()))
        lo, hi = b0[:, r].astype(np.int64), b1[:, r].astype(np.int64)
        starved[:, r], starved_comm[:, r] = iv.overlap_lengths(lo, hi, s, e), iv.overlap_lengths(lo, hi, sc, ec)
        before[:, r, :] = _covered(s, e, run.ready[:, r, :]) - _covered(s, e, b0[:, r])[:, None]
        before_comm[:, r, :] = _covered(sc, ec, run.ready[:, r, :]) - _covered(sc, ec, b0[:, r])[:, None]
        last = np.clip(np.searchsorted(start, b1[:, r], side="left") - 1, 0, max(start.size - 1, 0))
        slack[:, r] = np.maximum(start[last] - launch[last], 0.0) if start.size else 0.0
        at = np.clip(np.searchsorted(start, run.ready[:, r, :], side="right") - 1, 0, max(start.size - 1, 0))
        lead[:, r, :] = np.maximum(start[at] - launch[at], 0.0) if start.size else 0.0
    return starved, before, starved_comm, before_comm, slack, lead


@dataclass(frozen=True)
class Stalled:
    """Per replayed step and rank (N, R): backward's length, the tail after it, and the calls' time in
    flight before backward ended."""

    backward_ns: np.ndarray
    tail_ns: np.ndarray
    comm_under_ns: np.ndarray


def replay_stalls(ready: np.ndarray, compute_ns: np.ndarray, call_ns: np.ndarray, slowdown: np.ndarray) -> Stalled:
    """The module docstring's replay; `slowdown` broadcasts against (N, R) (one per replayed step)."""
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


def _call_waits(gpu: GpuRun, rows: np.ndarray, calls: int) -> np.ndarray:
    """Per replayed rank-step (N, R) each call's wait for the other ranks (the step's first call aside) at
    `calls` calls: the recorded waits are the other ranks' host time per call's issue, once per call (at most
    the recorded wait per call), and a remainder that is their skew, once per step; the first part scales with
    the calls, the second does not. The recorded layout keeps its recorded waits."""
    host = np.asarray(gpu.host_ns, dtype=float)
    others = np.array([np.delete(host, r).max(initial=0.0) for r in range(host.size)])  # a handful of ranks
    recorded = np.maximum(gpu.wait_calls[rows], 1.0)
    per_call = np.minimum(others[None, :], gpu.wait_ns[rows] / recorded)  # never more than was waited
    skew = gpu.wait_ns[rows] - recorded * per_call
    return (skew + max(calls - 1, 0) * per_call) / max(calls - 1, 1)


def predict_gpu(
    gpu: GpuRun,
    run: RecordedRun,
    rows: np.ndarray,
    lam: np.ndarray,
    wait: np.ndarray,
    buckets: list[np.ndarray],
    cost_ns: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per replayed step and rank (N, R): the predicted step, the change in communication in flight under
    backward and the change in tail, at the given buckets. rows (N): the recorded steps replayed; lam,
    wait (N): the slowdown and per-call wait each is replayed with; cost_ns (N, K): each call's transfer."""
    lam3 = lam[:, None, None]
    b0 = run.backward_start[rows].astype(float)
    span = run.backward_end[rows] - b0
    comm_under = gpu.comm_under_ns[rows]
    # compute alone: no stall, no wait for the host (an idle with a collective in flight is the stall's share
    # first, so that a run whose compute stops under its collectives is not counted twice)
    starved = gpu.starved_ns[rows] - lam[:, None] * gpu.starved_comm_ns[rows]
    work = span - lam[:, None] * comm_under - starved
    progress = gpu.elapsed[rows] - lam3 * gpu.comm_before[rows] - gpu.starved_before[rows]
    progress = progress + lam3 * gpu.starved_comm_before[rows]
    ready = np.stack([progress[:, :, b].max(axis=2) for b in buckets], axis=2)
    call = cost_ns[:, None, :] + _call_waits(gpu, rows, len(buckets))[:, :, None] + np.zeros_like(ready)
    call[:, :, 0] = cost_ns[:, None, 0] + gpu.first_wait_ns[rows]
    st = replay_stalls(ready, work, call, lam[:, None])
    # the host issues backward's kernels and every call: a call more (or fewer) than recorded before a gradient
    # moves the host's later launches by the rank's host time per call; more calls delay backward once they
    # outrun the host's lead over the GPU there, fewer end it sooner down to what the GPU needs
    host = np.broadcast_to(gpu.host_ns[None, :], span.shape)
    moved = host[:, :, None] * (
        calls_before(np.array([b.max() for b in buckets]), run.ready.shape[2]) - recorded_calls_before(run)
    )
    moved_end = gpu.host_ns[None, :] * (len(buckets) - (gpu.wait_calls[rows] + 1))
    delay = np.maximum((moved - gpu.lead_at[rows]).max(axis=2), moved_end - gpu.slack_ns[rows])
    host_bound = np.where(moved_end > 0, span + np.maximum(delay, 0.0), span - gpu.slack_ns[rows] + moved_end)
    backward = np.where(host > 0, np.maximum(st.backward_ns, host_bound), st.backward_ns)  # unmeasured: no bound
    tail = st.tail_ns  # a host-bound backward launches its last calls that much later: the tail moves with it
    step = run.step_ns[rows] - span - run.tail_ns[rows] + backward + tail
    return step, st.comm_under_ns - comm_under, tail - run.tail_ns[rows]
