"""Communication per process group and rank, hidden under compute or exposed: `group_overlap_rows(calls,
compute)`, each rank's `groups` in `analysis.overlap --format json`.

One row per (rank, group) over the whole capture:
  calls            the rank's collective calls in that group
  comm_ms          |union of those calls' intervals| (arrival to completion, collective_calls.py)
  overlap_ms       |that union ∩ the rank's compute| (the compute the overlap metrics use)
  exposed_comm_ms  comm_ms - overlap_ms
  overlap_pct      100 * overlap_ms / comm_ms (NaN without communication)
  folded_calls     of those calls, the ones inferred and folded into this group (call_groups.fold_inferred)
Union semantics within a row, so overlap_ms + exposed_comm_ms = comm_ms exactly; calls of two groups in flight
together count in both rows (the groups are not a partition of the rank's communication time).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.measure.call_groups import FOLDED, GROUP_COLUMNS, group_label
from analysis.measure.op_phase import comm_and_hidden
from analysis.trace.frames import NS_PER_MS

GROUP_OVERLAP_COLUMNS = [
    "rank",
    *GROUP_COLUMNS,
    "label",
    "calls",
    "comm_ms",
    "overlap_ms",
    "exposed_comm_ms",
    "overlap_pct",
    "folded_calls",
]


GROUP_FIGURES = [
    "calls",
    "comm_ms",
    "overlap_ms",
    "exposed_comm_ms",
    "overlap_pct",
    "folded_calls",
]  # each rank's `groups` in JSON


def empty_group_rows() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=object) for c in GROUP_OVERLAP_COLUMNS})


def group_overlap_rows(calls: pd.DataFrame, compute: dict) -> pd.DataFrame:
    """GROUP_OVERLAP_COLUMNS rows from calls (rank, GROUP_COLUMNS, start_ns, end_ns) and each rank's compute
    (rank -> canonical interval set)."""
    if len(calls) == 0 or "group_ranks" not in calls:
        return empty_group_rows()
    keys = ["rank", *GROUP_COLUMNS]
    folded = calls[FOLDED].to_numpy(bool) if FOLDED in calls else np.zeros(len(calls), dtype=bool)
    frame = (
        calls[[*keys, "start_ns", "end_ns"]]
        .assign(**{FOLDED: folded})
        .astype({"group": str, "group_desc": str, "group_ranks": str, "group_inferred": bool})
    )
    grouped = frame.groupby(keys, sort=True)
    rows = grouped.size().rename("calls").reset_index()
    comm_ns, hidden_ns = comm_and_hidden(
        grouped.ngroup().to_numpy(), rows["rank"].to_numpy(), frame, compute, len(rows)
    )
    rows["comm_ms"] = comm_ns / NS_PER_MS
    rows["overlap_ms"] = hidden_ns / NS_PER_MS
    rows["exposed_comm_ms"] = (comm_ns - hidden_ns) / NS_PER_MS
    rows["folded_calls"] = grouped[FOLDED].sum().to_numpy(np.int64)
    rows["overlap_pct"] = np.where(comm_ns > 0, 100.0 * hidden_ns / np.maximum(comm_ns, 1), np.nan)
    labels = {k: group_label(*k) for k in rows[GROUP_COLUMNS].drop_duplicates().itertuples(index=False, name=None)}
    rows["label"] = [labels[k] for k in rows[GROUP_COLUMNS].itertuples(index=False, name=None)]
    return rows[GROUP_OVERLAP_COLUMNS]
