"""One row per sharded unit's all-gather per rank, step and phase: did it arrive in time, and if not, why.

`gather_rows(trace, rows, phases) -> DataFrame` (GATHER_COLUMNS), from the collectives view's call rows
(collective_rows.py) of the all-gathers issued in a step's forward or backward. Which definition a row
uses is in `definition`:

  GPU traces (calls from kernels):  HELD, gather_held.py: how long the unit's compute stream was held
      waiting for the weights; `cause` by gather_cause.py's rules.
  CPU traces (calls from ranges):   WAITED, in_time.waited_ns: how long before the gather completed the
      rank had stopped computing; `cause` is `late` or `in time` (a CPU trace has no streams or
      launches to tell the causes apart).

Times (issue/start/end/ready) in ms on the trace's clock as in the call rows, durations in ms.

`needed_ns` (`forward_reached`): when the rank reached the unit's forward, where the trace says so: the
start of FSDP2's `FSDP::pre_forward (<module>)` range (the first of the module's ranges in the process that
ends after the call's issue); -1 where the trace has no such range (this project's `fsdp` marks its
collectives, not each module's forward: there, the time compute waited says how late the gather was).
PREFETCH_COLUMNS: the forward gathers' columns the collectives view's `prefetch` gives (rank, step, tag,
issue_ns, end_ns, waited_ns: the row's held or waited time, needed_ns), times on the trace's clock.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from analysis.fsdp_units.gather_cause import CPU_LATE, IN_TIME, LATE_NS, with_causes
from analysis.fsdp_units.gather_held import held_rows
from analysis.measure.phases import process_key, ranges_named
from analysis.measure.torch_calls import FSDP_MODULE
from analysis.trace.frames import KERNELS, NS_PER_MS, Trace

HELD = "held (GPU: compute stream waiting)"
WAITED = "waited (CPU)"
PHASES = ("forward", "backward")
PREFETCH_COLUMNS = ["rank", "step", "tag", "issue_ns", "end_ns", "waited_ns", "needed_ns"]
FSDP_PRE_FORWARD = r"^FSDP::pre_forward \(([^)]+)\)"
GATHER_COLUMNS = [
    "rank",
    "step",
    "phase",
    "unit",
    "definition",
    "held_ms",
    "cause",
    "issue_ms",
    "start_ms",
    "end_ms",
    "ready_ms",
    "hide_ms",
    "not_started_ms",
    "queued_ms",
    "queued_behind",
    "partner_ms",
    "last_rank",
    "moving_ms",
    "bytes",
    "busbw_gbps",
    "typical_busbw_gbps",
    "issue_ns",
    "end_ns",
    "needed_ns",
]


def _gpu(trace: Trace, mine: pd.DataFrame, rows: pd.DataFrame) -> pd.DataFrame:
    """The GPU columns: held time, its parts and cause (a gather not queued names nothing it queued behind)."""
    held = held_rows(trace, mine, rows)
    out = with_causes(pd.concat([mine.reset_index(drop=True), held], axis=1))
    waited_behind = held["queue_end_ns"].to_numpy() > held["gather_launch_ns"].to_numpy()
    measured = out["held_ns"].to_numpy() >= 0
    return out.assign(
        definition=HELD,
        held_ms=np.where(measured, out["held_ns"] / NS_PER_MS, np.nan),
        ready_ms=np.where(measured, out["ready_ns"] / NS_PER_MS, np.nan),
        queued_behind=np.where(waited_behind, out["queued_behind"], ""),
    )


def _cpu(mine: pd.DataFrame) -> pd.DataFrame:
    """The CPU columns: waited (in_time.py) and no cause beyond late / in time."""
    waited = mine["waited_ms"].to_numpy(float)
    nan = np.full(len(mine), np.nan)
    return mine.reset_index(drop=True).assign(
        definition=WAITED,
        held_ms=waited,
        cause=np.where(waited * NS_PER_MS > LATE_NS, CPU_LATE, IN_TIME),
        ready_ms=nan,
        hide_ms=nan,
        not_started_ms=nan,
        queued_ms=nan,
        queued_behind="",
        partner_ms=nan,
        moving_ms=nan,
        typical_busbw_gbps=nan,
    )


# the dtypes of gather_rows' columns (float64 where not named), as its lookups give them
_DTYPES = {"rank": "int64", "step": "int64", "last_rank": "int64", "issue_ns": "int64", "end_ns": "int64"}
_DTYPES |= {"needed_ns": "int64", "unit": "str", "definition": "str", "phase": "object", "cause": "object"}
_DTYPES |= {"queued_behind": "object"}


def no_gather_rows() -> pd.DataFrame:
    """gather_rows of calls that have no all-gather in a step's forward or backward: no row."""
    return pd.DataFrame({c: pd.Series(dtype=_DTYPES.get(c, "float64")) for c in GATHER_COLUMNS})


def gather_rows(trace: Trace, rows: pd.DataFrame, phases: np.ndarray) -> pd.DataFrame:
    """GATHER_COLUMNS of the all-gathers among the call rows issued in a step's forward or backward
    (`phases`: each row's phase, comm_breakdown.phase_labels)."""
    pick = (rows["op"].to_numpy() == "all_gather") & (rows["step"].to_numpy() >= 0) & np.isin(phases, PHASES)
    if not pick.any():  # no gather to look up (a DDP run): the columns alone, as the lookups would leave them
        return no_gather_rows()
    mine = rows[pick].assign(phase=phases[pick], unit=rows.loc[pick, "tag"].astype(str).replace("", "(root)"))
    if (rows["source"] == KERNELS).any():  # calls timed from kernels: a GPU trace with streams and launches
        out = _gpu(trace, mine, rows)
    else:
        out = _cpu(mine)
    ranks = trace.ranks[["rank", "part", "pid"]].drop_duplicates("rank")
    where = out[["rank"]].merge(ranks, on="rank", how="left")
    forward = out["phase"].to_numpy() == "forward"
    reached = forward_reached(
        trace,
        where["part"].to_numpy(np.int64),
        where["pid"].to_numpy(np.int64),
        out["unit"],
        out["issue_ns"].to_numpy(),
    )
    return out.assign(needed_ns=np.where(forward, reached, -1))[GATHER_COLUMNS]


def _module_key(part: np.ndarray, pid: np.ndarray, module: pd.Series, modules: pd.Index) -> np.ndarray:
    """One int64 per (process, module name), modules numbered by `modules`."""
    return (process_key(part, pid) << 20) | modules.get_indexer(module.to_numpy()).astype(np.int64)


def forward_reached(trace: Trace, part: np.ndarray, pid: np.ndarray, tag: pd.Series, issue: np.ndarray) -> np.ndarray:
    """Per call: start of the first `FSDP::pre_forward (<tag>)` range of its process that ends after
    its issue; -1 where none."""
    out = np.full(len(issue), -1, dtype=np.int64)
    pre = ranges_named(trace.nvtx, re.compile(FSDP_PRE_FORWARD))
    if len(pre) == 0 or len(issue) == 0:
        return out
    module = pre["text"].astype(str).str.extract(FSDP_MODULE)[0].fillna("")
    modules = pd.Index(pd.unique(module.to_numpy()))
    right = pd.DataFrame(
        {
            "key": _module_key(pre["part"].to_numpy(), pre["pid"].to_numpy(), module, modules),
            "end": pre["end"].to_numpy(),
        }
    ).assign(start=pre["start"].to_numpy())
    right = right.sort_values("end", kind="stable")  # a call whose tag names no such module gets key -1: no match
    left = pd.DataFrame(
        {"key": _module_key(part, pid, tag.astype(str), modules), "t": issue + 1, "i": np.arange(len(issue))}
    ).sort_values("t", kind="stable")
    found = pd.merge_asof(left, right, left_on="t", right_on="end", by="key", direction="forward")
    has = found["start"].notna().to_numpy()
    out[found["i"].to_numpy()[has]] = found["start"].to_numpy()[has].astype(np.int64)
    return out
