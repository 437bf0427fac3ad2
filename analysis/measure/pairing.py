"""Cross-rank pairing of collective calls: who arrived when, who waited, how long the transfer took.

The k-th call of an op in a step of a process group on each of its member ranks is one logical collective
(NCCL and gloo require every rank of a communicator to issue its collectives in the same order; matching
per op and per step as well keeps a capture that starts at different calls on different ranks aligned at
each step). A call's group is its name with its members (call_groups.py); calls without a named group
are every rank's, and pair as one pool per op, as when a trace names no communicator.
For each collective: arrival of each rank = its call's start (kernel start, or range start on range
traces), last arrival = the latest of them; per rank
    wait_ns     = last arrival - own start, clipped to [0, own duration]
    transfer_ns = own duration - wait_ns   (= own end - last arrival when the last arrival is inside)
so wait + transfer = the call's duration exactly. A collective is paired when every rank of the run
(world size from `ddp.meta`, else the ranks in the trace) has its call, and at least two do; otherwise
wait and transfer stay NaN and `partners` says how many ranks had it. In a group of named members the
same holds with the group's size in place of the world size.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.measure import intervals as iv


def world_size(meta: dict, ranks_in_trace: int) -> int:
    """The run's world size from `ddp.meta` (largest recorded), else the number of ranks in the trace."""
    sizes = [m.get("world_size") for m in meta.values()]
    sizes = [s for s in sizes if isinstance(s, int) and s > 0]
    return max(sizes) if sizes else ranks_in_trace


def group_ids(calls: pd.DataFrame, world: int) -> tuple[np.ndarray, np.ndarray]:
    """Per call: an integer naming its process group (name with members) within the frame, and the group's
    size (its members, or `world` for a group of every rank: group_ranks ""). Without group columns every
    call is in one group of `world` ranks."""
    if "group_ranks" not in calls:
        return np.zeros(len(calls), dtype=np.int64), np.full(len(calls), world, dtype=np.int64)
    names = calls["group"].astype(str).to_numpy(dtype=object)
    ranks = calls["group_ranks"].astype(str).to_numpy(dtype=object)
    codes, uniques = pd.factorize(pd.Series(names + "|" + ranks), sort=True)
    members = [u.split("|", 1)[1] for u in uniques]
    sizes = np.array([m.count(",") + 1 if m else world for m in members] or [world], dtype=np.int64)
    return codes.astype(np.int64), sizes[codes]


def pair(calls: pd.DataFrame, world: int) -> pd.DataFrame:
    """Calls (rank, op, step, start_ns, end_ns, and group, group_ranks where known) with group_id, seq,
    partners, paired, last_arrival_ns, last_rank, wait_ns, transfer_ns added (a new frame; the input is not
    modified)."""
    out = calls.sort_values(["rank", "start_ns"], kind="stable").reset_index(drop=True)
    out["group_id"], size = group_ids(out, world)
    out["seq"] = out.groupby(["rank", "group_id", "op", "step"], sort=False).cumcount().astype(np.int64)
    key = ["group_id", "op", "step", "seq"]
    group = out.groupby(key, sort=False)
    out["partners"] = group["rank"].transform("size").astype(np.int64)
    out["last_arrival_ns"] = group["start_ns"].transform("max").astype(np.int64)
    latest = out.loc[group["start_ns"].idxmax(), [*key, "rank"]].rename(columns={"rank": "last_rank"})
    out = out.merge(latest, on=key, how="left")
    out["paired"] = (out["partners"].to_numpy() >= 2) & (out["partners"].to_numpy() == size)
    start, end = out["start_ns"].to_numpy(), out["end_ns"].to_numpy()
    duration = end - start
    wait = np.clip(out["last_arrival_ns"].to_numpy() - start, 0, duration)
    paired = out["paired"].to_numpy()
    out["wait_ns"] = np.where(paired, wait, np.nan)
    out["transfer_ns"] = np.where(paired, duration - wait, np.nan)
    out["last_rank"] = out["last_rank"].where(paired, -1).astype(np.int64)
    return out


def exposure(paired: pd.DataFrame, compute: dict) -> pd.DataFrame:
    """exposed_ns, exposed_wait_ns, exposed_transfer_ns: the parts of each call (and of its wait and
    transfer) with none of its own rank's compute under them."""
    n = len(paired)
    exposed, exposed_wait = np.zeros(n), np.full(n, np.nan)
    start, end = paired["start_ns"].to_numpy(), paired["end_ns"].to_numpy()
    wait = paired["wait_ns"].to_numpy()
    has_wait = ~np.isnan(wait)
    wait_end = start + np.where(has_wait, wait, 0).astype(np.int64)
    for rank, rows in paired.groupby("rank", sort=False).indices.items():  # one iteration per rank
        s, e = compute.get(int(rank), (iv.EMPTY, iv.EMPTY))
        exposed[rows] = (end[rows] - start[rows]) - iv.overlap_lengths(start[rows], end[rows], s, e)
        w = (wait_end[rows] - start[rows]) - iv.overlap_lengths(start[rows], wait_end[rows], s, e)
        exposed_wait[rows] = np.where(has_wait[rows], w, np.nan)
    return pd.DataFrame(
        {"exposed_ns": exposed, "exposed_wait_ns": exposed_wait, "exposed_transfer_ns": exposed - exposed_wait},
        index=paired.index,
    )
