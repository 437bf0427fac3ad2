"""Per-call work besides the transfer, measured from the recorded trace: the host time each collective's issue
takes (dividing the bucket, writing its flags, launching the collective and its events), which a bucket size
with more calls pays more often.

Two measurements, the first found wins:
  `comm_issue` ranges (contract.COMM_ISSUE_PREFIX): the push/pop range a bucketed strategy opens around each
      bucket's issue. Part of an issue's time grows with the bucket's bytes (on CPU the division of the
      gradients: about 0.09 ms per MB against 0.75 ms for the rest), and a layout moves the same bytes in any
      number of calls, so only the rest is paid once per call: the ranges' lengths are fitted against their
      calls' bytes (comm_cost.fit_line) and a rank's figure is the median of its ranges less their per-byte
      part. Ranges whose bytes are unknown, or whose sizes cannot tell a per-byte part apart (one size, or the
      larger no slower), count whole.
  CUDA launches (GPU traces without those ranges): per collective, the host time on its rank between the
      last kernel launch before its `comm:` range opened and the launch after its own (the first after the
      range opened),
      less two of the rank's typical gaps between consecutive launches (what the host takes anyway).
Neither (CPU traces recorded before the ranges existed): 0, and `source` says why.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from analysis.advise.comm_cost import fit_line
from analysis.measure.phases import codes, process_key
from analysis.trace.frames import GPU_KERNEL, NVTX_PUSH_POP, Trace
from contract import COMM_ISSUE_PREFIX

RANGES = "comm_issue ranges"
LAUNCHES = "CUDA launches around each collective"


@dataclass(frozen=True)
class CallCost:
    """Per rank (in the order asked for) the host ns each collective's issue takes, and how it was measured."""

    host_ns: np.ndarray
    source: str
    calls: int  # how many calls the figure is the median of

    @property
    def measured(self) -> bool:
        return self.calls > 0


def _rank_of(trace: Trace, part: pd.Series, pid: pd.Series) -> np.ndarray:
    ranks = trace.ranks[["part", "pid", "rank"]].drop_duplicates(["part", "pid"])
    keys = dict(zip(process_key(ranks["part"], ranks["pid"]).tolist(), ranks["rank"].tolist(), strict=True))
    return pd.Series(process_key(part, pid)).map(keys).to_numpy(dtype=float)


def _from_ranges(trace: Trace, calls: pd.DataFrame) -> pd.DataFrame:
    """rank, host_ns of every `comm_issue` push/pop range, less the part that grows with its call's bytes."""
    nvtx = trace.nvtx
    hit = nvtx["text"].astype(str).str.startswith(COMM_ISSUE_PREFIX).to_numpy() & (codes(nvtx["kind"]) == NVTX_PUSH_POP)
    own = nvtx[hit]
    host = (own["end"] - own["start"]).to_numpy(float)
    nbytes = np.full(host.size, np.nan)
    if {"op", "tag", "bytes"} <= set(calls.columns) and len(calls):
        by_name = calls.groupby(calls["op"].astype(str) + ":" + calls["tag"].astype(str))["bytes"].median()
        nbytes = own["text"].astype(str).str[len(COMM_ISSUE_PREFIX) :].map(by_name).to_numpy(dtype=float)
    known = ~np.isnan(nbytes) & (nbytes > 0)
    if known.any():
        _, per_byte, untold = fit_line(nbytes[known], host[known])
        if not untold:  # sizes that cannot tell a per-byte part apart (one size, the larger no slower): count whole
            host = np.where(known, np.maximum(host - per_byte * np.nan_to_num(nbytes), 0.0), host)
    return pd.DataFrame({"rank": _rank_of(trace, own["part"], own["pid"]), "host_ns": host}).dropna()


def _from_launches(trace: Trace, calls: pd.DataFrame) -> pd.DataFrame:
    """rank, host_ns per collective kernel from the rank's kernel launches (module docstring)."""
    ops = trace.gpu_ops
    kernels = ops[(codes(ops["kind"]) == GPU_KERNEL) & (ops["launch_start"].to_numpy() >= 0)]
    kernels = kernels.merge(trace.ranks[["part", "pid", "device", "rank"]], on=["part", "pid", "device"])
    out = []
    for rank, mine in calls.groupby("rank"):  # one pass per rank (a handful)
        launches = np.sort(kernels.loc[kernels["rank"] == rank, "launch_start"].to_numpy(dtype=float))
        if launches.size < 3:
            continue
        gap = float(np.median(np.diff(launches)))
        at = np.searchsorted(launches, mine["issue_ns"].to_numpy(dtype=float), side="left")
        before, after = at - 1, at + 1  # at: the collective's own launch, the first after its range opened
        ok = (before >= 0) & (after < launches.size)
        host = launches[np.minimum(after, launches.size - 1)] - launches[np.maximum(before, 0)] - 2 * gap
        out.append(pd.DataFrame({"rank": rank, "host_ns": np.maximum(host[ok], 0.0)}))
    return pd.concat(out, ignore_index=True) if out else pd.DataFrame(columns=["rank", "host_ns"])


def call_cost(trace: Trace, calls: pd.DataFrame, ranks: list, gpu: bool) -> CallCost:
    """The host time per collective issue of each of `ranks` (calls: the run's calls in steps, with rank,
    issue_ns, the start of the call's `comm:` range, and op, tag and bytes where known)."""
    found, source = _from_ranges(trace, calls), RANGES
    if found.empty and gpu:
        found, source = _from_launches(trace, calls), LAUNCHES
    if found.empty:
        why = "not measured: no comm_issue ranges in the trace" + ("" if gpu else " (CPU traces have no launches)")
        return CallCost(np.zeros(len(ranks)), why, 0)
    per_rank = found.groupby("rank")["host_ns"].median()
    fallback = float(found["host_ns"].median())
    host = per_rank.reindex(ranks).fillna(fallback).to_numpy(dtype=float)
    return CallCost(host, source, len(found))
