"""The one place a run's files get one clock: `clock_shifts(parts) -> [ns per part]`, `align_clocks(trace)`.

Each file of a run (nsys export or torch.profiler JSON) has its own clock. The readers return every
file's times on that file's own clock and record, per part, what the file says about it (its
UTC-minus-trace-clock offset, `info[part][CLOCK_OFFSET_KEY]`: nsys TARGET_INFO_SESSION_START_TIME,
Kineto baseTimeNanoseconds). `clock_shifts` decides how far to move each part onto the first
part's clock; every path that merges files uses it: the one-piece load (`align_clocks`, called by
runs.load_trace) and the per-file merge of --jobs/--dask (rank_merge.combine). A better estimate
(from the collectives the ranks shared) plugs in here and nowhere else.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from analysis.frames.trace import CLOCK_OFFSET_KEY, Trace


@dataclass(frozen=True)
class PartClock:
    """What is known about one file's clock. `recorded_offset_ns`: UTC ns minus trace-clock ns as
    the file records it (0 when it does not say); `calls`: the file's collective calls on its own
    clock (collective_calls.find_calls' frame: rank, op, step, start_ns, end_ns, ...) when the
    caller has them, else None."""

    recorded_offset_ns: int
    calls: pd.DataFrame | None = None


def clock_shifts(parts: Sequence[PartClock]) -> list[int]:
    """ns to add to each part's times to put them on the first part's clock (the first part's
    shift is 0). Today from the recorded offsets alone: two files' clocks agree as far as their
    recorded UTC anchors do."""
    if not parts:
        return []
    first = parts[0].recorded_offset_ns
    return [int(p.recorded_offset_ns - first) for p in parts]


def recorded_clocks(trace: Trace) -> list[PartClock]:
    """The trace's parts' clocks as the readers recorded them (part order)."""
    parts = sorted(trace.info) or [0]
    return [PartClock(int(trace.info.get(p, {}).get(CLOCK_OFFSET_KEY, 0) or 0)) for p in parts]


def _shift_columns(frame: pd.DataFrame, columns: Sequence[str], by_part: np.ndarray) -> pd.DataFrame:
    """The frame with `columns` moved by its rows' part's shift; -1 (none) stays -1."""
    if frame.empty or not by_part.any():
        return frame
    delta = by_part[frame["part"].to_numpy()]
    out = frame.copy(deep=False)
    for c in columns:
        if c in out:
            values = out[c].to_numpy()
            out[c] = np.where(values >= 0, values + delta, values)
    return out


def align_clocks(trace: Trace, shifts: Sequence[int] | None = None) -> Trace:
    """The trace with every part's times on the first part's clock (`shifts`: clock_shifts of its
    recorded clocks unless given). Returns a new Trace; the caller's frames are not changed."""
    shifts = clock_shifts(recorded_clocks(trace)) if shifts is None else list(shifts)
    if not any(shifts):
        return trace
    by_part = np.asarray(shifts, dtype=np.int64)
    return replace(
        trace,
        gpu_ops=_shift_columns(trace.gpu_ops, ("start", "end", "launch_start"), by_part),
        nvtx=_shift_columns(trace.nvtx, ("start", "end"), by_part),
        collectives=_shift_columns(trace.collectives, ("start", "end"), by_part),
    )
