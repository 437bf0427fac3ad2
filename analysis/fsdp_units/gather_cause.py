"""Why an all-gather held its unit's compute stream: `with_causes(rows)` (GPU traces; gather_held.py).

A gather is late when held > LATE_NS (10 µs). Its held time [ready, end] is cut into four
consecutive parts that add up to it:

    not_started  ready .. its kernel's start, less `queued`: not yet launched by the host, or launched
                 onto a free stream but not yet running (a GPU busy with other work)
    queued       its launch .. the end of the op before it on its stream, when that ended after the
                 launch and before the start: waiting behind an earlier collective (`queued_behind`)
    partner      its start .. the last rank's arrival: running, waiting for another rank's call
    moving       the last arrival .. end: moving data

(each time clipped to [ready, end]). The cause of a late gather, the first rule that holds:

  1. queued       the queued part is the largest: it started only when an earlier collective on its
                  stream ended (the reduce-scatters in backward, the gather before it in forward)
  2. partner      the partner part is the largest: the other rank's call started later
  3. slow         its bus bandwidth is under SLOW_SHARE (half) of the run's median for the same op and
                  byte count (`typical_busbw_gbps`): the transfer itself was slow
  4. issued late  otherwise (not_started + moving is the largest, at a normal bandwidth): issued too
                  close to its use to start and finish in time (prefetch depth: `hide_ms`, issue to
                  ready, is the compute it had to hide under)

Not late (held <= LATE_NS): `host` when the unit's first compute op was launched after the gather had
ended and its stream sat idle more than LATE_NS before that launch (the GPU waited for the CPU, not for
the weights: CPU-bound), else `in time`. `unmarked` where held could not be measured (no wait range,
gather_held.py).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.trace.frames import NS_PER_MS

LATE_NS = 10_000
SLOW_SHARE = 0.5
IN_TIME, HOST, QUEUED, PARTNER, SLOW, ISSUED_LATE, UNMARKED = (
    "in time",
    "host",
    "queued",
    "partner",
    "slow",
    "issued late",
    "unmarked",
)
CPU_LATE = "late"  # a late gather on a CPU trace (no streams or launches to tell the causes apart)
LATE_CAUSES = (QUEUED, PARTNER, SLOW, ISSUED_LATE)  # the rules' priority order
CAUSES = (*LATE_CAUSES, CPU_LATE, HOST, IN_TIME, UNMARKED)
CAUSE_TEXT = {
    QUEUED: "queued behind an earlier collective on its stream",
    PARTNER: "waiting for the other rank's call",
    SLOW: "slow transfer",
    ISSUED_LATE: "issued too late to hide",
    HOST: "the unit's first kernel launched after the gather ended",
    IN_TIME: "in time",
    UNMARKED: "not measured (no comm_wait range)",
    CPU_LATE: "late (CPU trace: cause not determined)",
}


def held_parts(rows: pd.DataFrame) -> pd.DataFrame:
    """not_started_ns, queued_ns, partner_ns, moving_ns of each row (ready_ns, gather_launch_ns,
    queue_end_ns, start_ns, last_arrival_ns, end_ns, held_ns): the held time cut as the module says."""
    end = rows["end_ns"].to_numpy(np.int64)
    lo = np.where(rows["held_ns"].to_numpy(np.int64) > 0, rows["ready_ns"].to_numpy(np.int64), end)

    def clip(t: np.ndarray) -> np.ndarray:
        return np.clip(t, lo, end)

    start = clip(rows["start_ns"].to_numpy(np.int64))
    raw_launch = rows["gather_launch_ns"].to_numpy(np.int64)
    launch = clip(np.where(raw_launch >= 0, raw_launch, rows["start_ns"].to_numpy(np.int64)))
    queue_end = rows["queue_end_ns"].to_numpy(np.int64)
    behind = (queue_end > raw_launch) & (raw_launch >= 0)
    queued = np.where(behind, np.maximum(np.minimum(clip(queue_end), start) - np.minimum(launch, start), 0), 0)
    arrival = np.maximum(clip(rows["last_arrival_ns"].to_numpy(np.int64)), start)
    return pd.DataFrame(
        {
            "not_started_ns": start - lo - queued,
            "queued_ns": queued,
            "partner_ns": arrival - start,
            "moving_ns": end - arrival,
        },
        index=rows.index,
    )


def typical_busbw(rows: pd.DataFrame) -> np.ndarray:
    """The median busbw of the rows with the same op and byte count (NaN where none known)."""
    keys = [rows["op"].astype(str), rows["bytes"].fillna(-1)]
    return rows.groupby(keys, sort=False)["busbw_gbps"].transform("median").to_numpy(float)


def causes(rows: pd.DataFrame, parts: pd.DataFrame, typical: np.ndarray) -> np.ndarray:
    """The cause of each row by the module's rules (rows: held_ns, kernel_launch_ns, end_ns,
    ready_ns, busbw_gbps; parts: held_parts)."""
    held = rows["held_ns"].to_numpy(np.int64)
    q, p = parts["queued_ns"].to_numpy(), parts["partner_ns"].to_numpy()
    own = parts["not_started_ns"].to_numpy() + parts["moving_ns"].to_numpy()
    busbw = rows["busbw_gbps"].to_numpy(float)
    slow = busbw < SLOW_SHARE * typical  # NaN compares False: unknown bandwidth is never "slow"
    late_cause = np.select(
        [(q >= p) & (q >= own), (p > q) & (p >= own), slow], [QUEUED, PARTNER, SLOW], ISSUED_LATE
    ).astype(object)
    launch, end = rows["kernel_launch_ns"].to_numpy(np.int64), rows["end_ns"].to_numpy(np.int64)
    idle_before = launch - rows["stream_free_ns"].to_numpy(np.int64) > LATE_NS
    host = (launch >= end) & idle_before
    return np.select([held < 0, held > LATE_NS, host], [UNMARKED, late_cause, HOST], IN_TIME).astype(object)


def with_causes(rows: pd.DataFrame) -> pd.DataFrame:
    """rows (gather_held columns plus op, bytes, busbw_gbps, start_ns, end_ns, last_arrival_ns,
    issue_ns) with the held parts in ms, typical_busbw_gbps, hide_ms and cause."""
    parts = held_parts(rows)
    typical = typical_busbw(rows)
    out = rows.assign(
        cause=causes(rows, parts, typical),
        typical_busbw_gbps=typical,
        hide_ms=np.where(rows["ready_ns"] >= 0, (rows["ready_ns"] - rows["issue_ns"]) / NS_PER_MS, np.nan),
    )
    for name in parts:
        out[name.replace("_ns", "_ms")] = parts[name] / NS_PER_MS
    return out
