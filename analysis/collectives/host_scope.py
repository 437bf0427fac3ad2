"""Within one host or across hosts: which calls' groups span several machines, `host_scopes(trace, rows)`.

A rank's host is the `hostname` its `ddp.meta` records. A call is `intra-host` when every member of its group
(every rank of the run for a group of all ranks) is on one host, `inter-host` when they are on several, and ''
when a member's host is unknown or the run has one host: the outputs split waits and bandwidth by scope only
for runs whose ranks report more than one host.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.trace.frames import Trace

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
