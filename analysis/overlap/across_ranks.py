"""The per-step view of a run across its ranks: `across_ranks(steps, step_ranges, shifts)`.

A step is as slow as its slowest rank, and its ranks' CPU step ranges, put on the first file's clock,
show how far apart they started and finished it. A run loaded in one piece has one clock already
(`run_across_ranks`); a run merged from its files' results shifts each file's ranges (rank_merge.py).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.run.loaded_run import LoadedRun
from analysis.trace.frames import NS_PER_MS

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
