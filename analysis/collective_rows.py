"""Per-call rows of the collectives view for one loaded trace: `call_rows(trace) -> (rows, facts)`.

Composes collective_calls (calls per rank), pairing (wait/transfer across ranks, exposure) and
collective_stats (bandwidths); `comm_split_by_step` sums the rows per rank and step for the
overlap table. Columns: ROW_COLUMNS (ms figures, and exact ns times on the trace's clock).
"""
from __future__ import annotations

import pandas as pd

from analysis import collective_stats as stats
from analysis.collective_calls import find_calls
from analysis.pairing import exposure, pair, world_size
from analysis.patterns import Patterns
from analysis.trace import Trace

NS_PER_MS = 1e6
ROW_COLUMNS = ["path", "implementation", "source", "rank", "step", "phase", "op", "tag", "bytes", "issue_ms",
               "start_ms", "end_ms", "duration_ms", "wait_ms", "transfer_ms", "algbw_gbps", "busbw_gbps",
               "exposed_ms", "exposed_wait_ms", "exposed_transfer_ms", "seq", "partners", "paired", "last_rank",
               "kernel", "issue_ns", "start_ns", "end_ns", "last_arrival_ns"]


def call_rows(trace: Trace, patterns: Patterns | None = None) -> tuple[pd.DataFrame, dict]:
    """(one row per call per rank with every ROW_COLUMNS figure, trace facts: source, world size, note)."""
    calls = find_calls(trace, patterns)
    world = world_size(trace.meta, len(trace.ranks))
    rows = pair(calls.frame, world)
    rows = pd.concat([rows, exposure(rows, calls.compute)], axis=1)
    for ns in ("issue", "start", "end"):
        rows[f"{ns}_ms"] = rows[f"{ns}_ns"] / NS_PER_MS
    rows["duration_ms"] = (rows["end_ns"] - rows["start_ns"]) / NS_PER_MS
    for part in ("wait", "transfer", "exposed", "exposed_wait", "exposed_transfer"):
        rows[f"{part}_ms"] = rows.pop(f"{part}_ns") / NS_PER_MS
    rows = pd.concat([rows, stats.bandwidths(rows)], axis=1)
    rows = rows.assign(path=trace.path, implementation=trace.implementation, source=calls.source)
    facts = {"path": trace.path, "implementation": trace.implementation, "source": calls.source,
             "world_size": world, "ranks": len(trace.ranks), "calls": len(rows),
             "unpaired_calls": int((~rows["paired"]).sum()), "note": _note(rows, world, len(trace.ranks))}
    return rows[ROW_COLUMNS], facts


def _note(rows: pd.DataFrame, world: int, ranks: int) -> str:
    """Why some calls have no wait/transfer ('' when every call is paired)."""
    if rows.empty:
        return "no collective calls found (no NCCL/RCCL kernels and no comm:<op>:<tag> ranges)"
    if rows["paired"].all():
        return ""
    if ranks < 2 or ranks < world:
        return (f"{ranks} of {world} ranks in this trace: wait and transfer need every rank's calls; give all "
                "ranks' files together with --merge")
    lonely = sorted(set(rows.loc[~rows["paired"], "rank"].tolist()))
    return f"{int((~rows['paired']).sum())} calls of ranks {lonely} have no matching call on every rank"


SPLIT_COLUMNS = {"wait_ms": "comm_wait_ms", "transfer_ms": "comm_transfer_ms",
                 "exposed_wait_ms": "exposed_comm_wait_ms", "exposed_transfer_ms": "exposed_comm_transfer_ms"}


def comm_split_by_step(rows: pd.DataFrame) -> pd.DataFrame:
    """rank, step and the sums of wait, transfer and their exposed parts over the step's paired calls
    (NaN where a rank-step has calls but none paired)."""
    paired = rows[rows["paired"]]
    sums = paired.groupby(["rank", "step"])[list(SPLIT_COLUMNS)].sum()
    keys = rows[["rank", "step"]].drop_duplicates().set_index(["rank", "step"])
    return keys.join(sums).rename(columns=SPLIT_COLUMNS).reset_index()
