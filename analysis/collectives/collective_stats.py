"""Bandwidths and summaries of paired collective calls (see call_groups.pair for wait and transfer).

algbw = bytes / transfer time (GB/s: bytes per ns); busbw = algbw x the nccl-tests factor for the op
and the n ranks of the collective: all-reduce 2(n-1)/n; all-gather, reduce-scatter, all-to-all
(n-1)/n; broadcast, reduce, send/recv 1. It is NaN when bytes or transfer are unknown or zero.

Host scope (`host_scopes(trace, rows)`): a rank's host is the `hostname` its `ddp.meta` records. A call
is `intra-host` when every member of its group (every rank of the run for a group of all ranks) is on
one host, `inter-host` when they are on several, and '' when a member's host is unknown or the run has
one host: the outputs split waits and bandwidth by scope only for runs whose ranks report more than
one host.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from analysis.trace.frames import NS_PER_MS, Trace

SIZE_EDGES = np.array([0, 4 << 10, 64 << 10, 1 << 20, 16 << 20, 256 << 20], dtype=float)
SIZE_LABELS = ["<4K", "4K-64K", "64K-1M", "1M-16M", "16M-256M", ">=256M"]


def bus_factor(op: np.ndarray, n: np.ndarray) -> np.ndarray:
    """nccl-tests bus-bandwidth factor per (op, ranks); NaN for ops it does not define."""
    n = np.asarray(n, dtype=float)
    op = np.asarray(op, dtype=object)
    return np.select(
        [
            op == "all_reduce",
            np.isin(op, ["all_gather", "reduce_scatter", "all_to_all"]),
            np.isin(op, ["broadcast", "reduce", "send_recv"]),
        ],
        [2 * (n - 1) / n, (n - 1) / n, np.ones_like(n)],
        np.nan,
    )


def size_class(nbytes: np.ndarray) -> np.ndarray:
    """Message-size bins of a factor 16 (labels in SIZE_LABELS), 'unknown' when bytes are unknown."""
    b = np.asarray(nbytes, dtype=float)
    i = np.clip(np.searchsorted(SIZE_EDGES, np.nan_to_num(b, nan=0.0), side="right") - 1, 0, len(SIZE_LABELS) - 1)
    return np.where(np.isnan(b), "unknown", np.asarray(SIZE_LABELS, dtype=object)[i])


def bandwidths(calls: pd.DataFrame) -> pd.DataFrame:
    """algbw_gbps and busbw_gbps per call (bytes per ns of transfer is GB/s)."""
    transfer = calls["transfer_ms"].to_numpy(dtype=float) * NS_PER_MS
    nbytes = calls["bytes"].to_numpy(dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        alg = np.where((transfer > 0) & (nbytes > 0), nbytes / transfer, np.nan)
    bus = alg * bus_factor(calls["op"].to_numpy(), calls["partners"].to_numpy())
    return pd.DataFrame({"algbw_gbps": alg, "busbw_gbps": bus}, index=calls.index)


def _summarise(groups: Any) -> pd.DataFrame:
    """count, bytes, time, median/p90 busbw, wait and exposed shares of each group of calls."""
    frame = groups.agg(
        calls=("op", "size"),
        bytes=("bytes", lambda b: b.sum(min_count=1)),
        duration_ms=("duration_ms", "sum"),
        wait_ms=("wait_ms", "sum"),
        transfer_ms=("transfer_ms", "sum"),
        exposed_ms=("exposed_ms", "sum"),
        median_busbw_gbps=("busbw_gbps", "median"),
        p90_busbw_gbps=("busbw_gbps", lambda b: b.quantile(0.9)),
    )
    time = frame["duration_ms"].where(frame["duration_ms"] > 0)
    frame["wait_share"] = frame["wait_ms"] / time
    frame["exposed_share"] = frame["exposed_ms"] / time
    return frame.reset_index()


def by_size(calls: pd.DataFrame) -> pd.DataFrame:
    """One row per (op, size class): see _summarise."""
    return _summarise(
        calls.assign(size_class=size_class(calls["bytes"].to_numpy())).groupby(["op", "size_class"], sort=True)
    )


def by_rank(calls: pd.DataFrame) -> pd.DataFrame:
    """One row per rank: see _summarise."""
    return _summarise(calls.groupby("rank", sort=True))


def stragglers(calls: pd.DataFrame) -> pd.DataFrame:
    """Per step: the rank whose late arrivals made the others wait longest.

    In each paired collective the last-arriving rank makes every other rank wait; summed per step and
    last rank, the largest sum names the straggler (None when nobody waited). `times_last`: in how
    many of the step's collectives it arrived last; `wait_caused_ms`: the others' wait it caused;
    `wait_ms`: all waiting in the step (every rank); `collectives`: paired logical collectives.
    """
    keys = [c for c in ("group", "group_ranks", "op", "step", "seq") if c in calls]
    paired = calls[[*keys, "last_rank", "wait_ms"]][calls["paired"]]  # the columns read, not every one of the rows
    columns = ["step", "collectives", "straggler", "times_last", "wait_caused_ms", "wait_ms"]
    if paired.empty:
        return pd.DataFrame(columns=columns)
    logical = paired.drop_duplicates(keys)
    caused = paired.groupby(["step", "last_rank"])["wait_ms"].sum().rename("wait_caused_ms").reset_index()
    times_last = logical.groupby(["step", "last_rank"]).size().rename("times_last").reset_index()
    caused = caused.merge(times_last, on=["step", "last_rank"], how="left")
    top = caused.sort_values(["step", "wait_caused_ms", "times_last"], ascending=[True, False, False])
    top = top.drop_duplicates("step").set_index("step")
    per_step = pd.DataFrame(
        {"collectives": logical.groupby("step").size(), "wait_ms": paired.groupby("step")["wait_ms"].sum()}
    )
    out = per_step.join(top).reset_index()
    nobody = ~(out["wait_caused_ms"] > 0)
    out["straggler"] = out["last_rank"].astype("Int64").mask(nobody)
    out["times_last"] = out["times_last"].astype("Int64").mask(nobody)
    return out[columns]


def by_group(calls: pd.DataFrame) -> pd.DataFrame:
    """One row per process group (its label: call_groups.group_label): see _summarise."""
    from analysis.measure.call_groups import GROUP_COLUMNS, group_label

    if calls.empty or "group_ranks" not in calls:
        return pd.DataFrame(columns=["group"])
    keys = calls[GROUP_COLUMNS].astype({"group": str, "group_desc": str, "group_ranks": str, "group_inferred": bool})
    codes, uniques = pd.factorize(pd.MultiIndex.from_frame(keys))
    labels = np.array([group_label(*u) for u in uniques], dtype=object)
    return _summarise(calls.assign(group=labels[codes]).groupby("group", sort=True))


def group_count(calls: pd.DataFrame) -> int:
    """How many process groups the calls name (one when they name none)."""
    if calls.empty or "group_ranks" not in calls:
        return 1
    return int(calls[["group", "group_ranks"]].astype(str).drop_duplicates().shape[0])


def by_host_scope(calls: pd.DataFrame) -> pd.DataFrame:
    """One row per host scope (intra-host, inter-host: host_scopes) of the calls that have one: see _summarise."""
    scoped = calls[calls["host_scope"] != ""] if "host_scope" in calls else calls.iloc[:0]
    if scoped.empty:
        return pd.DataFrame(columns=["host_scope"])
    return _summarise(scoped.groupby("host_scope", sort=True))


INTRA, INTER = "intra-host", "inter-host"


def rank_hosts(trace: Trace) -> dict[int, str]:
    """rank -> the hostname its process's ddp.meta records (ranks without one left out)."""
    named = {key: m.get("hostname") for key, m in trace.meta.items() if isinstance(m.get("hostname"), str)}
    pairs = zip(trace.ranks["rank"].tolist(), trace.ranks["part"].tolist(), trace.ranks["pid"].tolist(), strict=True)
    return {int(rank): named[(part, pid)] for rank, part, pid in pairs if (part, pid) in named}


def host_scopes(trace: Trace, rows: pd.DataFrame, world: int) -> np.ndarray:
    """Per call row (group_ranks): INTRA, INTER or '' (see the module docstring)."""
    hosts = rank_hosts(trace)
    out = np.full(len(rows), "", dtype=object)
    if len(set(hosts.values())) < 2 or "group_ranks" not in rows:
        return out
    codes, members = pd.factorize(rows["group_ranks"].astype(str))
    every = list(range(world))
    scopes = []
    for text in members:  # one per distinct group
        ranks = [int(r) for r in text.split(",")] if text else every
        seen = {hosts.get(r) for r in ranks}
        scopes.append("" if None in seen else INTRA if len(seen) == 1 else INTER)
    return np.array([*scopes, ""], dtype=object)[codes]
