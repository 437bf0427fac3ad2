"""Communication broken down, each part split into the time hidden under compute and the exposed rest:
per collective op and training phase (`op_phase_rows(calls, compute)`, the `by_op_phase` of
`analysis.overlap --format json`) and per process group (`group_overlap_rows`, its `groups`).

One row per (rank[, step], op, phase):
  calls        collective calls of that op issued in that phase (and step)
  bytes        the sum of their byte counts (NaN when none is known)
  comm_ms      |union of the calls' intervals| (arrival to completion, collective_calls.py)
  hidden_ms    |that union ∩ the rank's compute| (all of the rank's compute, as for overlap_ms)
  exposed_ms   comm_ms - hidden_ms: the time the rank waited with nothing else to do
  all_comm_ms, all_exposed_ms   the same for all of the rank's calls of that step (of the capture, for
               step NA), every op and phase together: the same on each of its rows
Union semantics within a row, so hidden_ms + exposed_ms = comm_ms exactly (integer ns underneath).
The rows are not a partition: calls of different ops or phases can be in flight together (one issued
in backward still running in the optimizer), and that time counts in each of their rows, so the rows'
comm_ms can add up to more than all_comm_ms, which counts it once (the outputs say so when they do).

The phase of a call (`phase_labels`) comes from where it was issued: inside the step's `forward`,
`backward` or `optimizer` range (the contract's names, or what the patterns match in other people's
traces); `after backward`: inside `grad_sync`, inside FSDP2's `FSDP::root_post_backward_callback`, or
between the end of a backward range and the next phase range of the step; FSDP2's own markers give the
phase where the trace has no phase ranges of ours (`FSDP::pre_forward`, `FSDP::forward_prefetch ...`:
forward; `FSDP::pre_backward`, `FSDP::post_backward_*`, `FSDP::backward_prefetch ...`: backward);
`other`: inside a step otherwise; `outside steps`: in no step.

Per process group, one row per (rank, group) over the whole capture:
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

from analysis.measure import intervals as iv
from analysis.measure.call_groups import FOLDED, GROUP_COLUMNS, group_label
from analysis.measure.collective_calls import OUTSIDE_STEPS
from analysis.measure.phases import keyed_contains, process_key, ranges_named
from analysis.trace.frames import NS_PER_MS, Trace
from analysis.trace.patterns import Patterns
from analysis.trace.phase_markers import FSDP_AFTER_BACKWARD, FSDP_BACKWARD, FSDP_FORWARD
from contract import GRAD_SYNC

FORWARD, BACKWARD, OPTIMIZER, AFTER_BACKWARD, OTHER, OUTSIDE = (
    "forward",
    "backward",
    "optimizer",
    "after backward",
    "other",
    OUTSIDE_STEPS,
)
PHASE_ORDER = [FORWARD, BACKWARD, AFTER_BACKWARD, OPTIMIZER, OTHER, OUTSIDE]
OP_PHASE_COLUMNS = [
    "rank",
    "step",
    "op",
    "phase",
    "calls",
    "bytes",
    "comm_ms",
    "hidden_ms",
    "exposed_ms",
    "all_comm_ms",
    "all_exposed_ms",
]
# collective_calls' phase (innermost range at issue) -> ours, before the markers refine it
_BASE = {"forward": FORWARD, "backward": BACKWARD, "optimizer": OPTIMIZER, GRAD_SYNC: AFTER_BACKWARD}


def _inside(ranges: pd.DataFrame, part: np.ndarray, pid: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Whether each time t lies inside one of `ranges` of its process (part, pid)."""
    if len(ranges) == 0:
        return np.zeros(t.shape, dtype=bool)
    keys = process_key(ranges["part"], ranges["pid"])
    return keyed_contains(keys, ranges["start"], ranges["end"], process_key(part, pid), t)


def _last_phase_ended(trace: Trace, patterns: Patterns, part: np.ndarray, pid: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Per time: which phase range (forward/backward/optimizer) of its process ended last at or before it
    ('' when none did)."""
    frames = [
        ranges_named(trace.nvtx, patterns.regex(field))[["part", "pid", "end"]].assign(name=name)
        for field, name in (("forward", FORWARD), ("backward", BACKWARD), ("optimizer", OPTIMIZER))
    ]
    ended = pd.concat(frames, ignore_index=True)
    if len(ended) == 0 or t.size == 0:
        return np.full(t.shape, "", dtype=object)
    ended = ended.assign(key=process_key(ended["part"], ended["pid"])).sort_values("end", kind="stable")
    probe = pd.DataFrame({"key": process_key(part, pid), "t": t, "i": np.arange(t.size)}).sort_values("t")
    found = pd.merge_asof(probe, ended[["key", "end", "name"]], left_on="t", right_on="end", by="key")
    out = np.full(t.shape, "", dtype=object)
    out[found["i"].to_numpy()] = found["name"].fillna("").to_numpy(dtype=object)
    return out


def phase_labels(trace: Trace, calls: pd.DataFrame, patterns: Patterns | None = None) -> np.ndarray:
    """Each call's phase by the rule in the module docstring; `calls`: collective_calls' frame (part,
    pid, issue_ns, phase)."""
    patterns = patterns or Patterns()
    part, pid = calls["part"].to_numpy(np.int64), calls["pid"].to_numpy(np.int64)
    t = calls["issue_ns"].to_numpy(np.int64)
    found = calls["phase"].astype(str).to_numpy(dtype=object)
    out = pd.Series(found).map(_BASE).to_numpy(dtype=object)
    out[pd.isna(out)] = OUTSIDE
    out[found == "step"] = OTHER
    own = np.isin(out, [FORWARD, BACKWARD, OPTIMIZER])
    after = (found == "step") & (_last_phase_ended(trace, patterns, part, pid, t) == BACKWARD)
    out[after] = AFTER_BACKWARD
    for regex, name in ((FSDP_FORWARD, FORWARD), (FSDP_BACKWARD, BACKWARD), (FSDP_AFTER_BACKWARD, AFTER_BACKWARD)):
        marked = _inside(ranges_named(trace.nvtx, regex), part, pid, t) & ~own
        out[marked] = name
    out[found == OUTSIDE_STEPS] = OUTSIDE  # outside the steps of a process that has them: no marker moves it
    return out


def op_phase_rows(calls: pd.DataFrame, compute: dict, per_step: bool = True) -> pd.DataFrame:
    """OP_PHASE_COLUMNS rows from calls (rank, step, op, phase, bytes, start_ns, end_ns; phase as
    phase_labels names it) and each rank's compute (rank -> canonical interval set). per_step=False:
    one row per (rank, op, phase) over all calls, step NA."""
    if len(calls) == 0:
        return pd.DataFrame({c: pd.Series(dtype=object) for c in OP_PHASE_COLUMNS})
    keys = ["rank", "step", "op", "phase"] if per_step else ["rank", "op", "phase"]
    frame = calls[[*keys, "bytes", "start_ns", "end_ns"]].astype({"op": str, "phase": str})
    grouped = frame.groupby(keys, sort=True)
    group = grouped.ngroup().to_numpy()
    rows = grouped.size().rename("calls").reset_index()
    rows["bytes"] = grouped["bytes"].sum(min_count=1).to_numpy(dtype=float)
    comm_ns, hidden_ns = comm_and_hidden(group, rows["rank"].to_numpy(), frame, compute, len(rows))
    rows["comm_ms"] = comm_ns / NS_PER_MS
    rows["hidden_ms"] = hidden_ns / NS_PER_MS
    rows["exposed_ms"] = (comm_ns - hidden_ns) / NS_PER_MS
    whole = frame.groupby(keys[:-2], sort=True)  # (rank[, step]): every op and phase at once
    all_comm, all_hidden = comm_and_hidden(
        whole.ngroup().to_numpy(), whole.size().reset_index()["rank"].to_numpy(), frame, compute, whole.ngroups
    )
    at = whole.ngroup().groupby(group).first().to_numpy()  # each row's (rank[, step]) group
    rows["all_comm_ms"] = all_comm[at] / NS_PER_MS
    rows["all_exposed_ms"] = (all_comm - all_hidden)[at] / NS_PER_MS
    if not per_step:
        rows.insert(1, "step", pd.array([None] * len(rows), dtype="Int64"))
    order = {p: i for i, p in enumerate(PHASE_ORDER)}
    rows = rows.assign(_o=rows["phase"].map(lambda p: order.get(p, len(order))))
    return rows.sort_values(["rank", "step", "_o", "op"], kind="stable").drop(columns="_o")[OP_PHASE_COLUMNS]


def comm_and_hidden(
    group: np.ndarray, group_rank: np.ndarray, frame: pd.DataFrame, compute: dict, n: int
) -> tuple[np.ndarray, np.ndarray]:
    """Per group: |union of its calls| and |that union ∩ its rank's compute| in ns."""
    k, s, e = iv.keyed_union(group, frame["start_ns"].to_numpy(), frame["end_ns"].to_numpy())
    comm = iv.sum_by_key(k, e - s, n)
    hidden = np.zeros(k.size, dtype=np.int64)
    piece_rank = group_rank[k] if k.size else k
    for rank in np.unique(piece_rank):  # one iteration per rank, not per call
        mine = piece_rank == rank
        cs, ce = compute.get(int(rank), (iv.EMPTY, iv.EMPTY))
        hidden[mine] = iv.overlap_lengths(s[mine], e[mine], cs, ce)
    return comm, iv.sum_by_key(k, hidden, n)


GROUP_FIGURES = [
    "calls",
    "comm_ms",
    "overlap_ms",
    "exposed_comm_ms",
    "overlap_pct",
    "folded_calls",
]  # each rank's `groups` in JSON
GROUP_OVERLAP_COLUMNS = ["rank", *GROUP_COLUMNS, "label", *GROUP_FIGURES]


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
