"""Collective calls grouped: each call's process group (`group_columns`), then the calls of every rank that
are one collective (`pair`).

The process group of every collective call: `group_columns(trace, calls) -> GROUP_COLUMNS`.

  group           the group's name ("" when unknown)
  group_desc      its description ("" when unknown)
  group_ranks     its members, global ranks as "0,1,2"; "" for every rank of the run (the default group)
  group_inferred  True when nothing in the trace named the call's group: it is taken to be every rank's

Where it comes from, first found first:
1. our comm range's `@<group>` suffix (contract/groups.py), with the members and description the rank's
   `ddp.meta` lists for that name (a name the meta does not list: the name alone, every rank);
2. torch.profiler's own record of the call (`record_param_comms` ops: Process Group Name, Description,
   Ranks), the latest one of the process begun at or before the call's probe time (a kernel's launch,
   still open then; a range's start);
3. our comm range without a suffix: the default group (every rank), named `default`;
4. otherwise inferred: every rank, group_inferred.

`fold_inferred`: an inferred call (every rank) joins the named group of every rank when the run has one (the
default group of our ranges: a barrier's NCCL kernel outside every comm range is the default group's), so a
run with one real group has one group; `group_folded` marks the calls that were folded.

Cross-rank pairing of collective calls: who arrived when, who waited, how long the transfer took.

The k-th call of an op in a step of a process group on each of its member ranks is one logical collective
(NCCL and gloo require every rank of a communicator to issue its collectives in the same order; matching
per op and per step as well keeps a capture that starts at different calls on different ranks aligned at
each step). A call's group is its name with its members (above); calls without a named group
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

import itertools

import numpy as np
import pandas as pd

from analysis.measure import intervals as iv
from analysis.measure.phases import process_key
from analysis.trace.frames import Trace
from contract import DEFAULT_GROUP, GROUPS_KEY, dimension_of

GROUP_COLUMNS = ["group", "group_desc", "group_ranks", "group_inferred"]
FOLDED = "group_folded"  # True where an inferred call was folded into the named group of every rank
OURS, FOREIGN = DEFAULT_GROUP, ""  # what a comm range's `group` column holds without a suffix


def meta_groups(trace: Trace) -> pd.DataFrame:
    """part, pid, group, meta_desc, meta_ranks: each group each process's `ddp.meta` lists."""
    rows = [
        (part, pid, str(name), str(entry.get("description", "")), ",".join(str(int(r)) for r in entry["ranks"]))
        for (part, pid), meta in trace.meta.items()
        for name, entry in (meta.get(GROUPS_KEY) if isinstance(meta.get(GROUPS_KEY), dict) else {}).items()
        if isinstance(entry, dict) and isinstance(entry.get("ranks"), list)
    ]
    frame = pd.DataFrame(rows, columns=["part", "pid", "group", "meta_desc", "meta_ranks"])
    return frame.astype({"part": np.int64, "pid": np.int64, "group": object})


def _torch_groups(trace: Trace, part: np.ndarray, pid: np.ndarray, t: np.ndarray, closed: np.ndarray) -> pd.DataFrame:
    """Per probe (part, pid, time): the group of the latest torch `record_param_comms` op of its process begun at
    or before it (and, where `closed` is False, still open then): name, desc, ranks ('' where none)."""
    out = pd.DataFrame({"name": "", "desc": "", "ranks": ""}, index=np.arange(t.size), dtype=object)
    ops = trace.collectives
    if len(ops) == 0 or "group_ranks" not in ops or t.size == 0:
        return out
    ops = ops[(ops["collective"] != "wait") & ((ops["group_name"] != "") | (ops["group_ranks"] != ""))]
    ops = ops.assign(key=process_key(ops["part"], ops["pid"])).sort_values("start", kind="stable")
    probe = pd.DataFrame({"key": process_key(part, pid), "t": t, "i": np.arange(t.size)}).sort_values("t")
    found = pd.merge_asof(
        probe,
        ops[["key", "start", "end", "group_name", "group_desc", "group_ranks"]],
        left_on="t",
        right_on="start",
        by="key",
    )
    at = found["i"].to_numpy()
    hit = found["start"].notna().to_numpy() & (
        closed[at] | (found["end"].to_numpy(dtype=float) >= found["t"].to_numpy())
    )
    for column, source in (("name", "group_name"), ("desc", "group_desc"), ("ranks", "group_ranks")):
        out.loc[at, column] = np.where(hit, found[source].fillna("").to_numpy(dtype=object), "")
    return out


def group_columns(trace: Trace, calls: pd.DataFrame) -> pd.DataFrame:
    """GROUP_COLUMNS for calls (part, pid, group as the comm range gave it, probe_ns: the time that places the
    call among torch's records, probe_open: whether torch's record must still be open then)."""
    n = len(calls)
    part, pid = calls["part"].to_numpy(np.int64), calls["pid"].to_numpy(np.int64)
    named = calls["group"].fillna(FOREIGN).astype(str).to_numpy(dtype=object)
    keys = calls[["part", "pid"]].astype(np.int64).assign(group=named)
    listed = keys.merge(meta_groups(trace), on=["part", "pid", "group"], how="left")
    name, desc = named.copy(), listed["meta_desc"].fillna("").to_numpy(dtype=object, copy=True)
    ranks = listed["meta_ranks"].fillna("").to_numpy(dtype=object, copy=True)
    suffix = (named != FOREIGN) & (named != OURS)
    desc[~suffix], ranks[~suffix] = "", ""
    torch = _torch_groups(trace, part, pid, calls["probe_ns"].to_numpy(np.int64), ~calls["probe_open"].to_numpy(bool))
    by_torch = ~suffix & ((torch["name"] != "") | (torch["ranks"] != "")).to_numpy()
    name[by_torch] = torch["name"].to_numpy(dtype=object)[by_torch]
    desc[by_torch] = torch["desc"].to_numpy(dtype=object)[by_torch]
    ranks[by_torch] = torch["ranks"].to_numpy(dtype=object)[by_torch]
    inferred = ~suffix & ~by_torch & (named == FOREIGN)
    return pd.DataFrame(
        {"group": name, "group_desc": desc, "group_ranks": ranks, "group_inferred": inferred}, index=np.arange(n)
    )


def fold_inferred(groups: pd.DataFrame, world: int) -> pd.DataFrame:
    """GROUP_COLUMNS and FOLDED: the inferred calls given the named group whose members are every one of `world`
    ranks (the default group, members "", first; else the one group listing every rank), unchanged when the
    calls name no such group or several."""
    inferred = groups["group_inferred"].to_numpy(bool)
    out = groups[GROUP_COLUMNS].assign(**{FOLDED: False})
    if not inferred.any() or inferred.all():
        return out
    every = ",".join(map(str, range(world)))
    named = groups.loc[~inferred, ["group", "group_desc", "group_ranks"]].astype(str).drop_duplicates()
    whole = named[(named["group_ranks"] == "") | (named["group_ranks"] == every)]
    default = whole[(whole["group_ranks"] == "") & (whole["group"] == DEFAULT_GROUP)]
    target = default if len(default) else whole
    if len(target) != 1:
        return out
    for column in ("group", "group_desc", "group_ranks"):
        out.loc[inferred, column] = target[column].iloc[0]
    out.loc[inferred, "group_inferred"] = False
    out.loc[inferred, FOLDED] = True
    return out


def folded_summary(calls: pd.DataFrame, world: int) -> list[dict]:
    """What fold_inferred folded in these calls (rank, op, FOLDED and GROUP_COLUMNS): per group folded into,
    {"into": its group object, "calls", "ranks": the ranks with folded calls, "ops"}; [] when nothing."""
    if FOLDED not in calls or not calls[FOLDED].astype(bool).any():
        return []
    folded = calls[calls[FOLDED].astype(bool)]
    out = []
    for _, mine in folded.groupby(["group", "group_ranks"], sort=True):  # one pass per group folded into
        first = mine.iloc[0]
        into = _group_object(str(first["group"]), str(first["group_desc"]), str(first["group_ranks"]), False, world)
        ranks, ops = sorted(int(r) for r in mine["rank"].unique()), sorted(str(o) for o in mine["op"].unique())
        out.append({"into": into, "calls": len(mine), "ranks": ranks, "ops": ops})
    return out


def group_objects(frame: pd.DataFrame, world: int) -> np.ndarray:
    """Per call: its group as the JSON outputs give it, {name, description, ranks, dimension} (ranks: every
    rank of a `world`-rank run for the default group), or None where the group was inferred."""
    keys = frame[GROUP_COLUMNS].astype({"group": str, "group_desc": str, "group_ranks": str, "group_inferred": bool})
    codes, uniques = pd.factorize(pd.MultiIndex.from_frame(keys))
    objects = np.empty(len(uniques), dtype=object)
    objects[:] = [_group_object(str(n), str(d), str(r), bool(i), world) for n, d, r, i in uniques]
    return objects[codes]


def _group_object(name: str, desc: str, ranks: str, inferred: bool, world: int) -> dict | None:
    if inferred:
        return None
    members = [int(r) for r in ranks.split(",")] if ranks else list(range(world))
    return {"name": name, "description": desc, "ranks": members, "dimension": dimension_of(name, desc)}


def group_label(name: str, desc: str, ranks: str, inferred: bool) -> str:
    """A group in a table: its dimension or name, then its members ('replicate 0,8,16', 'default all')."""
    if inferred:
        return "(inferred) all"
    return f"{dimension_of(name, desc) or name} {_members_text(ranks) if ranks else 'all'}"


def _members_text(ranks: str) -> str:
    """'0-7' for consecutive ranks, '0,8..56' for an even stride, else the list as recorded."""
    members = [int(r) for r in ranks.split(",")]
    steps = {b - a for a, b in itertools.pairwise(members)}
    if len(members) < 3 or len(steps) != 1:
        return ranks
    stride = steps.pop()
    return f"{members[0]}-{members[-1]}" if stride == 1 else f"{members[0]},{members[1]}..{members[-1]}"


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
