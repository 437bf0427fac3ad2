"""Per-call rows of the collectives view for one loaded trace: `call_rows(trace) -> (rows, facts)`.

Composes collective_calls (calls per rank), pairing (wait/transfer across ranks, exposure) and
collective_stats (bandwidths); `comm_split_by_step` sums the rows per rank and step for the
overlap table. Columns: ROW_COLUMNS (ms figures, and exact ns times on the trace's clock).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.collectives import collective_stats as stats
from analysis.fsdp_units.in_time import waited_by_rank
from analysis.measure.activity import RankWork
from analysis.measure.call_groups import FOLDED, GROUP_COLUMNS, exposure, pair, world_size
from analysis.measure.collective_calls import Calls, find_calls
from analysis.measure.comm_recognition import unrecognised_comm_note
from analysis.trace.frames import NS_PER_MS, Trace
from analysis.trace.patterns import Patterns

ROW_COLUMNS = [
    "path",
    "implementation",
    "source",
    "rank",
    "step",
    "phase",
    "op",
    "tag",
    "bytes",
    "issue_ms",
    "start_ms",
    "end_ms",
    "duration_ms",
    "wait_ms",
    "transfer_ms",
    "algbw_gbps",
    "busbw_gbps",
    "exposed_ms",
    "exposed_wait_ms",
    "exposed_transfer_ms",
    "waited_ms",
    "seq",
    "partners",
    "paired",
    "last_rank",
    "kernel",
    "family",
    "issue_ns",
    "start_ns",
    "end_ns",
    "last_arrival_ns",
    *GROUP_COLUMNS,
    FOLDED,
]


def call_rows(
    trace: Trace, patterns: Patterns | None = None, works: list[RankWork] | None = None, calls: Calls | None = None
) -> tuple[pd.DataFrame, dict]:
    """(one row per call per rank with every ROW_COLUMNS figure, trace facts: source, world size, note);
    `calls`: the trace's find_calls result when the caller has it already (else found with `works`)."""
    calls = calls if calls is not None else find_calls(trace, patterns, works)
    world = world_size(trace.meta, len(trace.ranks))
    rows, facts = rows_of_calls(calls, world, trace.path, trace.implementation, len(trace.ranks))
    unrecognised = unrecognised_comm_note(trace, patterns or Patterns(), world)
    return rows, {**facts, "note": unrecognised} if unrecognised else facts


def rows_of_calls(calls: Calls, world: int, path: str, implementation: str, ranks: int) -> tuple[pd.DataFrame, dict]:
    """call_rows from the calls of a run's `ranks` ranks (all on one clock), however they were found:
    one loaded trace, or every rank file's calls put together (rank_merge.py)."""
    rows = pair(calls.frame, world)
    rows = pd.concat([rows, exposure(rows, calls.compute)], axis=1)
    for ns in ("issue", "start", "end"):
        rows[f"{ns}_ms"] = rows[f"{ns}_ns"] / NS_PER_MS
    rows["duration_ms"] = (rows["end_ns"] - rows["start_ns"]) / NS_PER_MS
    for part in ("wait", "transfer", "exposed", "exposed_wait", "exposed_transfer"):
        rows[f"{part}_ms"] = rows.pop(f"{part}_ns") / NS_PER_MS
    rows["waited_ms"] = waited_by_rank(rows, calls.compute) / NS_PER_MS  # in_time.py
    rows = pd.concat([rows, stats.bandwidths(rows)], axis=1)
    rows = rows.assign(path=path, implementation=implementation, source=calls.source)
    facts = {
        "path": path,
        "implementation": implementation,
        "source": calls.source,
        "world_size": world,
        "ranks": ranks,
        "calls": len(rows),
        "unpaired_calls": int((~rows["paired"]).sum()),
        "note": _note(rows, world, ranks),
    }
    return rows[ROW_COLUMNS], facts


# what split_rows reads of the calls
SPLIT_CALL_COLUMNS = ["rank", "op", "step", "start_ns", "end_ns", "group", "group_ranks"]


def split_rows(calls: Calls, world: int) -> pd.DataFrame:
    """What `comm_split_by_step` reads of rows_of_calls' rows (rank, step, paired, wait_ms,
    transfer_ms, exposed_wait_ms, exposed_transfer_ms), computed the same way from the calls'
    SPLIT_CALL_COLUMNS (`op` only groups calls: any dtype) without the bandwidths and text."""
    rows = pair(calls.frame[SPLIT_CALL_COLUMNS], world)
    exposed = exposure(rows, calls.compute)
    return pd.DataFrame(
        {
            "rank": rows["rank"],
            "step": rows["step"],
            "paired": rows["paired"],
            "wait_ms": rows["wait_ns"] / NS_PER_MS,
            "transfer_ms": rows["transfer_ns"] / NS_PER_MS,
            "exposed_wait_ms": exposed["exposed_wait_ns"] / NS_PER_MS,
            "exposed_transfer_ms": exposed["exposed_transfer_ns"] / NS_PER_MS,
        }
    )


def _note(rows: pd.DataFrame, world: int, ranks: int) -> str:
    """Why some calls have no wait/transfer ('' when every call is paired)."""
    if rows.empty:
        return "no collective calls found (no NCCL/RCCL kernels and no comm:<op>:<tag> ranges)"
    if rows["paired"].all():
        return ""
    if world <= 1 and ranks == 1:  # a one-process job: its calls have no partners, nothing is missing
        return "one rank in the job (world size 1): no partner to wait for, so no wait or transfer split"
    if ranks < 2 or ranks < world:
        return (
            f"{ranks} of {world} ranks in this trace: wait and transfer need every rank's calls; give all "
            "ranks' files together with --merge"
        )
    lonely = sorted(set(rows.loc[~rows["paired"], "rank"].tolist()))
    return f"{int((~rows['paired']).sum())} calls of ranks {lonely} have no matching call on every rank"


SPLIT_COLUMNS = {
    "wait_ms": "comm_wait_ms",
    "transfer_ms": "comm_transfer_ms",
    "exposed_wait_ms": "exposed_comm_wait_ms",
    "exposed_transfer_ms": "exposed_comm_transfer_ms",
}


def comm_split_by_step(rows: pd.DataFrame) -> pd.DataFrame:
    """rank, step and the sums of wait, transfer and their exposed parts over the step's paired calls
    (NaN where a rank-step has calls but none paired)."""
    paired = rows[rows["paired"]]
    sums = paired.groupby(["rank", "step"])[list(SPLIT_COLUMNS)].sum()
    keys = rows[["rank", "step"]].drop_duplicates().set_index(["rank", "step"])
    return keys.join(sums).rename(columns=SPLIT_COLUMNS).reset_index()


def with_comm_split(
    per_step: pd.DataFrame, totals: pd.DataFrame, rows: pd.DataFrame
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The overlap frames (per rank and step; per rank) with SPLIT_COLUMNS added: sums over the calls
    issued in the step (whole capture: all the rank's calls). 0 where a rank (or rank-step) issued no
    call, NaN where its calls have no partner; a trace without step ranges (step NA) takes the totals."""
    split = comm_split_by_step(rows)
    names = list(SPLIT_COLUMNS.values())
    whole = split.groupby("rank")[names].sum(min_count=1).reset_index()
    totals = _filled(totals.merge(whole, on="rank", how="left", indicator=True), names)
    no_steps = per_step["step"].isna().to_numpy()
    keyed = per_step.assign(_step=per_step["step"].astype("Int64").fillna(-2).to_numpy(dtype=np.int64))
    by_step = keyed.merge(split.rename(columns={"step": "_step"}), on=["rank", "_step"], how="left", indicator=True)
    by_step = _filled(by_step, names).drop(columns="_step")
    if no_steps.any():
        whole_of = per_step[["rank"]].merge(totals[["rank", *names]], on="rank", how="left")
        by_step.loc[no_steps, names] = whole_of.loc[no_steps, names].to_numpy()
    return by_step, totals


def _filled(merged: pd.DataFrame, names: list[str]) -> pd.DataFrame:
    """After a merge with indicator: 0 in `names` for rows that had nothing to merge with."""
    merged.loc[(merged["_merge"] == "left_only").to_numpy(), names] = 0.0
    return merged.drop(columns="_merge")
