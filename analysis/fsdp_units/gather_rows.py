"""One row per sharded unit's all-gather per rank, step and phase: did it arrive in time, and if not, why.

`gather_rows(trace, rows, phases) -> DataFrame` (GATHER_COLUMNS), from the collectives view's call rows
(collective_rows.py) of the all-gathers issued in a step's forward or backward. Which definition a row
uses is in `definition`:

  GPU traces (calls from kernels):  HELD, gather_held.py: how long the unit's compute stream was held
      waiting for the weights; `cause` by gather_cause.py's rules.
  CPU traces (calls from ranges):   WAITED, in_time.waited_ns: how long before the gather completed the
      rank had stopped computing; `cause` is `late` or `in time` (a CPU trace has no streams or
      launches to tell the causes apart).

Times (issue/start/end/ready) in ms on the trace's clock as in the call rows, durations in ms;
`needed_ns`: where FSDP2 marks it, when the rank reached the unit's forward (prefetch.py), else -1.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.fsdp_units.gather_cause import CPU_LATE, IN_TIME, LATE_NS, with_causes
from analysis.fsdp_units.gather_held import held_rows
from analysis.fsdp_units.prefetch import forward_reached
from analysis.trace.frames import KERNELS, NS_PER_MS, Trace

HELD = "held (GPU: compute stream waiting)"
WAITED = "waited (CPU)"
PHASES = ("forward", "backward")
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


def gather_rows(trace: Trace, rows: pd.DataFrame, phases: np.ndarray) -> pd.DataFrame:
    """GATHER_COLUMNS of the all-gathers among the call rows issued in a step's forward or backward
    (`phases`: each row's phase, op_phase.phase_labels)."""
    pick = (rows["op"].to_numpy() == "all_gather") & (rows["step"].to_numpy() >= 0) & np.isin(phases, PHASES)
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
