"""Overlap metrics per rank and per step, exact to the nanosecond (union semantics throughout), and the
per-step view of a run across its ranks (`across_ranks`).

For each window (one step, see phases.step_windows for its bounds; or the whole capture):
  step_ms              the step window's length (GPU ranks: start to next step's start; CPU-only
                       ranks: the NVTX step range); whole capture: span of the rank's activity
  backward_ms          span of the backward pass's compute (GPU: first start to last end of its kernels)
  compute_ms           |union of compute|                 comm_ms   |union of communication|
  comm_kernel_ms       |union of communication kernels|   comm_copy_ms  |union of communication copies|
  overlap_ms           |comm ∩ compute|                   backward_overlap_ms  |comm ∩ backward compute|
  exposed_comm_ms      comm_ms - overlap_ms               overlap_pct  overlap/comm x 100 (NaN: no comm)
  idle_ms              window length minus the time inside it when the rank computed or communicated
                       (whichever step launched that work)
  comm_kernels, compute_kernels, comm_copies, comm_ranges  counts (comm_ranges: each collective once)
  comm_wait_ms, comm_transfer_ms, exposed_comm_wait_ms, exposed_comm_transfer_ms  the step's collective
                       calls split into waiting for the last rank and transfer, and the parts of each
                       not under compute (the collectives view; added by overlap/analyze.analyze_trace)
A step owns the work launched inside it (NVTX projection, see phases.py); its
communication is intersected with all of the rank's compute, so comm launched in step k and hidden
behind step k+1's compute still counts as overlapped.

Where each figure comes from (columns comm_source, compute_source):
  kernels/kernels  GPU ranks whose collectives run on the GPU: comm = communication kernels and copies.
  ranges/kernels   GPU ranks whose collectives run on the host (gloo with CUDA tensors: the GPU sees
                   only staging copies): comm = the comm NVTX ranges, compute = GPU compute kernels.
  ranges/ranges    CPU-only ranks: comm ranges, and forward/backward/optimizer ranges minus blocking
                   comm and gradient-sync waits.

Across ranks, a step is as slow as its slowest rank, and its ranks' CPU step ranges, put on the first file's
clock, show how far apart they started and finished it. A run loaded in one piece has one clock already
(`run_across_ranks`); a run merged from its files' results shifts each file's ranges (rank_merge.py).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.measure import intervals as iv
from analysis.measure.activity import Items, RankActivity, RankWork, rank_work
from analysis.run.loaded_run import LoadedRun
from analysis.trace.frames import NS_PER_MS, Trace
from analysis.trace.patterns import Patterns

# added by overlap/analyze.analyze_trace from the collectives view (collective_rows.with_comm_split)
SPLIT_METRICS = ["comm_wait_ms", "comm_transfer_ms", "exposed_comm_wait_ms", "exposed_comm_transfer_ms"]
METRICS = [
    "step_ms",
    "backward_ms",
    "compute_ms",
    "comm_ms",
    "comm_kernel_ms",
    "comm_copy_ms",
    "overlap_ms",
    "backward_overlap_ms",
    "exposed_comm_ms",
    "idle_ms",
    "overlap_pct",
    "comm_kernels",
    "compute_kernels",
    "comm_copies",
    "comm_ranges",
    *SPLIT_METRICS,
]
SOURCES = ["comm_source", "compute_source", "shared_gpu"]  # per rank: where the figures come from


def _between(pieces: iv.Set, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Per window [lo, hi): the length of the canonical set inside it."""
    return iv.covered_before(*pieces, hi) - iv.covered_before(*pieces, lo)


def _alone_and_backward(act: RankActivity) -> tuple[iv.Set, iv.Set]:
    """The rank's comm outside its compute, and the union of its backward compute."""
    backward = act.backward
    return act.comm_alone(), iv.union(backward.start, backward.end)


def _pieces(items: Items, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """keyed_union of items all in windows 0..n-1; one window: the items' own union (kept by Items), the
    same pieces keyed_union makes of a single key."""
    if n == 1:
        s, e = items.as_set()
        return np.zeros(s.size, dtype=np.int64), s, e
    return iv.keyed_union(items.window, items.start, items.end)


def _per_window_length(items: Items, n: int) -> np.ndarray:
    keys, s, e = _pieces(items, n)
    return iv.sum_by_key(keys, e - s, n)


def _per_window_overlap(pieces: tuple[np.ndarray, np.ndarray, np.ndarray], other: iv.Set, n: int) -> np.ndarray:
    """Per window: |union of the window's items ∩ other| (pieces: the items' keyed_union; other is one
    canonical set for the rank)."""
    keys, s, e = pieces
    return iv.sum_by_key(keys, iv.overlap_lengths(s, e, *other), n)


def _per_window_span(items: Items, n: int) -> np.ndarray:
    lo = np.full(n, np.iinfo(np.int64).max)
    hi = np.full(n, np.iinfo(np.int64).min)
    np.minimum.at(lo, items.window, items.start)
    np.maximum.at(hi, items.window, items.end)
    return np.where(hi > lo, hi - lo, 0)


def window_metrics(
    act: RankActivity, n: int, bounds: tuple[np.ndarray, np.ndarray], sets: tuple[iv.Set, iv.Set] | None = None
) -> pd.DataFrame:
    """Metrics for windows 0..n-1 of one rank; bounds: each window's (start, end) in ns; sets: the rank's
    (comm alone, backward) sets (act.comm_alone(), act.backward's union) when the caller has them."""
    comm_alone, backward_set = sets if sets is not None else _alone_and_backward(act)
    inside = lambda items: items.where(items.window >= 0)
    comm, compute, backward = inside(act.comm), inside(act.compute), inside(act.backward)
    comm_pieces = _pieces(comm, n)  # once for comm, overlap and backward
    comm_ns = iv.sum_by_key(comm_pieces[0], comm_pieces[2] - comm_pieces[1], n)
    overlap_ns = _per_window_overlap(comm_pieces, act.compute.as_set(), n)
    lo, hi = (np.asarray(b, dtype=np.int64) for b in bounds)
    busy_ns = _between(act.compute.as_set(), lo, hi) + _between(comm_alone, lo, hi)  # disjoint: lengths add up
    gpu = np.nan if not act.compute_are_kernels else 1.0  # CPU-only ranks have no kernels or copies
    frame = pd.DataFrame(
        {
            "step_ms": (hi - lo) / NS_PER_MS,
            "backward_ms": _per_window_span(backward, n) / NS_PER_MS,
            "compute_ms": _per_window_length(compute, n) / NS_PER_MS,
            "comm_ms": comm_ns / NS_PER_MS,
            "comm_kernel_ms": gpu * _per_window_length(inside(act.comm_kernels), n) / NS_PER_MS,
            "comm_copy_ms": gpu * _per_window_length(inside(act.comm_copies), n) / NS_PER_MS,
            "overlap_ms": overlap_ns / NS_PER_MS,
            "backward_overlap_ms": _per_window_overlap(comm_pieces, backward_set, n) / NS_PER_MS,
            "exposed_comm_ms": (comm_ns - overlap_ns) / NS_PER_MS,
            "idle_ms": (hi - lo - busy_ns) / NS_PER_MS,
            "overlap_pct": np.where(comm_ns > 0, 100.0 * overlap_ns / np.maximum(comm_ns, 1), np.nan),
        }
    )
    count = lambda windows: np.bincount(windows[windows >= 0], minlength=n)[:n]
    frame["comm_kernels"] = count(act.comm_kernels.window)
    frame["compute_kernels"] = count(act.compute.window) if act.compute_are_kernels else 0
    frame["comm_copies"] = count(act.comm_copies.window)
    frame["comm_ranges"] = count(act.comm_range_windows)
    return frame


def _rank_frames(work: RankWork) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(per-step rows, total row) for one rank."""
    span = work.whole.span
    # the whole capture's and the steps' items cover the same points (the windowing only labels them),
    # so their comm-alone and backward sets are measured once here and not kept after
    whole = work.whole
    sets = _alone_and_backward(whole)
    total = window_metrics(whole, 1, (np.array([span[0]]), np.array([span[1]])), sets)
    w = work.windows
    if len(w):
        per_step = window_metrics(work.steps, len(w), (w["start"].to_numpy(), w["end"].to_numpy()), sets)
        per_step.insert(0, "step", pd.array(w["step"].to_numpy(), dtype="Int64"))
    else:  # no step ranges: the whole capture is the one window
        per_step = total.copy()
        per_step.insert(0, "step", pd.array([None], dtype="Int64"))
    return per_step, total


def measure_trace(
    trace: Trace, patterns: Patterns | None = None, works: list[RankWork] | None = None
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(per-step frame, per-rank total frame), each keyed by rank, pid, device, with the rank's
    comm_source, compute_source and shared_gpu (its GPU also runs another rank's work); `works`:
    rank_work(trace, patterns) when the caller has it already."""
    from analysis.trace.run_info import shared_gpu_ranks

    shared = shared_gpu_ranks(trace)
    step_rows: list[pd.DataFrame] = []
    total_rows: list[pd.DataFrame] = []
    for work in works if works is not None else rank_work(trace, patterns):
        per_step, total = _rank_frames(work)
        for frame, bucket in ((per_step, step_rows), (total, total_rows)):
            frame.insert(0, "device", work.device)
            frame.insert(0, "pid", work.pid)
            frame.insert(0, "rank", work.rank)
            frame["comm_source"], frame["compute_source"] = work.comm_source, work.compute_source
            frame["shared_gpu"] = work.rank in shared
            bucket.append(frame)
    return pd.concat(step_rows, ignore_index=True), pd.concat(total_rows, ignore_index=True)


def _mean(column: pd.Series) -> float | None:
    """The mean of a column's non-NaN values (_mean_of)."""
    return _mean_of(column.to_numpy(dtype=np.float64, na_value=np.nan))


def _mean_of(values: np.ndarray) -> float:
    """The mean of the non-NaN values, summed in a contiguous copy: numpy sums a contiguous array
    pairwise but a strided one in sequence, so a frame's memory layout (how it was built: one load or
    merged files) would otherwise change the last bits."""
    values = np.ascontiguousarray(values)
    kept = values[~np.isnan(values)]
    return float(kept.sum() / kept.size) if kept.size else float("nan")


def _summary(means: dict, ranks: int, steps: int) -> dict:
    """summarise's dict from the metrics' means (overlap_pct left out: it is made from them here)."""
    overlap, comm = means["overlap_ms"], means["comm_ms"]
    means["overlap_pct"] = 100.0 * overlap / comm if overlap is not None and comm and comm > 0 else None
    return {"ranks": ranks, "steps": steps, **means}


def summarise(per_step: pd.DataFrame) -> dict:
    """Metrics averaged over the given steps of all ranks; overlap_pct from the averaged times."""
    if len(per_step) == 0:
        return {"ranks": 0, "steps": 0, **dict.fromkeys(METRICS)}
    out = {m: _mean(per_step[m]) if m in per_step else None for m in METRICS if m != "overlap_pct"}
    steps = int(per_step["step"].notna().sum()) if "step" in per_step else len(per_step)
    return _summary(out, int(per_step["rank"].nunique()), steps)


def summarise_each_step(per_step: pd.DataFrame) -> dict:
    """summarise of each step's rows, keyed by step, the columns read once (the same figures, bit for bit:
    each step's values are summed in their order, as summarise sums them)."""
    step = per_step["step"].to_numpy(dtype=np.float64, na_value=np.nan)
    rank = pd.Series(per_step["rank"].to_numpy())
    columns = {m: per_step[m].to_numpy(dtype=np.float64, na_value=np.nan) for m in METRICS if m in per_step}
    order = np.argsort(step, kind="stable")
    order = order[~np.isnan(step[order])]
    bounds = np.flatnonzero(np.diff(step[order])) + 1
    out = {}
    for rows in np.split(order, bounds) if order.size else []:  # one iteration per step, not per row
        means = {m: _mean_of(columns[m][rows]) if m in columns else None for m in METRICS if m != "overlap_pct"}
        out[per_step["step"].iat[rows[0]]] = _summary(means, int(rank.iloc[rows].nunique()), rows.size)
    return out


ACROSS_COLUMNS = [
    "path",
    "step",
    "ranks",
    "step_ms",
    "slowest_rank",
    "mean_step_ms",
    "start_skew_ms",
    "end_skew_ms",
    "exposed_comm_ms",
]


def across_ranks(steps: pd.DataFrame, step_ranges: dict[int, pd.DataFrame], shifts: dict[int, int]) -> pd.DataFrame:
    """One row per step number over the ranks that have it: step_ms of the slowest rank (the step is
    as slow as it), that rank, the mean; start/end skew: latest minus earliest start/end of the
    ranks' CPU step ranges (NVTX) on the first file's clock; the largest exposed_comm_ms. `step_ranges` and
    `shifts` (ns onto that clock) are keyed by the rows' part (file index)."""
    rows = steps[steps["step"].notna()]
    if rows.empty:
        return pd.DataFrame(columns=ACROSS_COLUMNS)
    at = pd.concat(
        [
            pd.DataFrame(
                {
                    "part": i,
                    "pid": r["pid"],
                    "step": r["step"],
                    "range_start": r["start"] + shifts[i],
                    "range_end": r["end"] + shifts[i],
                }
            )
            for i, r in step_ranges.items()
        ],
        ignore_index=True,
    )
    at = at.drop_duplicates(["part", "pid", "step"])  # a step number used twice: its first range
    rows = rows.assign(step=rows["step"].astype(np.int64)).merge(at, on=["part", "pid", "step"], how="left")
    by = rows.groupby(["path", "step"], sort=False)
    slowest = rows.loc[by["step_ms"].idxmax(), ["path", "step", "rank"]]
    out = by.agg(
        ranks=("rank", "nunique"),
        step_ms=("step_ms", "max"),
        mean_step_ms=("step_ms", "mean"),
        first_start=("range_start", "min"),
        last_start=("range_start", "max"),
        first_end=("range_end", "min"),
        last_end=("range_end", "max"),
        exposed_comm_ms=("exposed_comm_ms", "max"),
    ).reset_index()
    out = out.merge(slowest.rename(columns={"rank": "slowest_rank"}), on=["path", "step"])
    out["start_skew_ms"] = (out["last_start"] - out["first_start"]) / NS_PER_MS
    out["end_skew_ms"] = (out["last_end"] - out["first_end"]) / NS_PER_MS
    return out.sort_values(["step"], kind="stable")[ACROSS_COLUMNS].reset_index(drop=True)


def run_across_ranks(run: LoadedRun, steps: pd.DataFrame) -> pd.DataFrame:
    """across_ranks of a run loaded in one piece (its parts share one clock already)."""
    trace = run.trace
    ranges = run.step_ranges[["part", "pid", "step", "start", "end"]]
    with_part = steps.merge(trace.ranks[["rank", "part"]], on="rank", how="left")
    parts = sorted(int(p) for p in trace.ranks["part"].unique())
    by_part = {p: ranges[ranges["part"] == p].drop(columns="part") for p in parts}
    return across_ranks(with_part, by_part, dict.fromkeys(parts, 0))
