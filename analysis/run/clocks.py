"""The one place a run's files get one clock: `clock_shifts(parts) -> [ns per part]`, `align_clocks(trace)`.

Each file of a run (nsys export or torch.profiler JSON) has its own clock. The readers return every
file's times on that file's own clock and record, per part, what the file says about it (its
UTC-minus-trace-clock offset, `info[part][CLOCK_OFFSET_KEY]`: nsys TARGET_INFO_SESSION_START_TIME,
Kineto baseTimeNanoseconds). `clock_shifts` decides how far to move each part onto the first
part's clock; every path that merges files uses it: the one-piece load (`align_clocks`, called by
loaded_run.load_trace) and the per-file merge of --jobs/--dask (rank_merge.combine). Where the parts'
collective calls are known, `clock_alignment` checks the recorded clocks against an estimate from
the collectives the ranks shared (run/clock_offsets.py) and uses the estimate when they
disagree by more than its error; `clock_note` says what was done, per file.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from analysis.measure.call_groups import fold_inferred, group_columns, world_size
from analysis.measure.collective_calls import call_times
from analysis.run.clock_offsets import GROUP_KEYS, OffsetEstimate, collective_times, estimate_offsets
from analysis.trace.frames import CLOCK_NOTE_KEY, CLOCK_OFFSET_KEY, Trace
from analysis.trace.patterns import Patterns


@dataclass(frozen=True)
class PartClock:
    """What is known about one file's clock. `recorded_offset_ns`: UTC ns minus trace-clock ns as
    the file records it (0 when it does not say); `calls`: the file's collective calls on its own
    clock (collective_calls.find_calls' frame: rank, op, step, start_ns, end_ns, ...) when the
    caller has them, else None."""

    recorded_offset_ns: int
    calls: pd.DataFrame | None = None


MIN_SAMPLES = 8  # shared collectives needed before the estimate may overrule a recorded clock
# the estimate is trusted only when the collectives' ends agree this well (real NCCL pairs: 1-2 µs); ends
# further apart mean the calls matched are not one collective's, or the ranks do not end together
MAX_TRUSTED_ERROR_NS = 100_000


@dataclass(frozen=True)
class PartAlignment:
    """One part's clock: the shift its recorded offset gives (`recorded_shift_ns`), the estimate from
    the collectives (run/clock_offsets.py; `estimate.samples` 0: none), and the shift used."""

    recorded_shift_ns: int
    estimate: OffsetEstimate
    shift_ns: int

    @property
    def from_collectives(self) -> bool:
        return self.shift_ns != self.recorded_shift_ns


def clock_alignment(parts: Sequence[PartClock]) -> list[PartAlignment]:
    """Per part: how far to move its times onto the first part's clock, and why. The recorded
    offsets (session clocks) give the shift, unless the part shares at least MIN_SAMPLES
    collectives with the first part and their estimate disagrees with it by more than the
    estimate's error: then the collectives' estimate is used (clocks of different hosts disagree
    by milliseconds; the ranks' kernels of one collective end together within microseconds)."""
    if not parts:
        return []
    first = parts[0].recorded_offset_ns
    times = [collective_times(p.calls) if p.calls is not None and len(p.calls) else None for p in parts]
    out = []
    for part, estimate in zip(parts, estimate_offsets(times), strict=True):
        recorded = int(part.recorded_offset_ns - first)
        trusted = estimate.samples >= MIN_SAMPLES and estimate.error_ns <= MAX_TRUSTED_ERROR_NS
        disagrees = trusted and abs(estimate.offset_ns - recorded) > estimate.error_ns
        out.append(PartAlignment(recorded, estimate, estimate.offset_ns if disagrees else recorded))
    return out


def clock_shifts(parts: Sequence[PartClock]) -> list[int]:
    """ns to add to each part's times to put them on the first part's clock (the first part's
    shift is 0): clock_alignment's choice per part."""
    return [a.shift_ns for a in clock_alignment(parts)]


def clock_note(alignment: Sequence[PartAlignment], ranks_of_part: dict[int, list[int]]) -> str:
    """What a merged run's outputs say about its clocks: per file after the first, its ranks, the
    offset used, the collectives' estimate with its error and residual ('' for a single file)."""
    if len(alignment) < 2:
        return ""
    said = []
    for part, a in enumerate(alignment[1:], start=1):
        who = (
            ("rank " if len(ranks_of_part[part]) == 1 else "ranks ") + ",".join(map(str, ranks_of_part.get(part, [])))
            if ranks_of_part.get(part)
            else f"file {part}"
        )
        e = a.estimate
        if e.samples == 0:
            said.append(f"{who}: session clock (no shared collectives to check it)")
            continue
        if a.from_collectives:
            verdict = (
                f"aligned on the collectives, {(a.shift_ns - a.recorded_shift_ns) / 1e6:+.3f} ms from its session clock"
            )
        elif e.error_ns > MAX_TRUSTED_ERROR_NS or e.samples < MIN_SAMPLES:
            verdict = "session clock kept (the collectives' ends are too few or too scattered to check it)"
        else:
            verdict = "session clock kept (the collectives agree within their error)"
        said.append(
            f"{who}: {verdict}; offset {a.shift_ns / 1e6:.6f} ms, collectives' estimate "
            f"{e.offset_ns / 1e6:.6f} ms ± {e.error_ns / 1e3:.1f} µs, residual {e.residual_ns / 1e3:.1f} µs "
            f"over {e.samples} collectives"
        )
    return "clocks: " + "; ".join(said)


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


def align_on_collectives(trace: Trace, patterns: Patterns) -> Trace:
    """The trace with every part on the first part's clock by clock_alignment, the parts' calls found
    on their own clocks (gpu_ops.is_comm must be set: it does not change with a part's shift), and
    the alignment's clock_note under CLOCK_NOTE_KEY in info[0]. One part: the trace as it is."""
    clocks = recorded_clocks(trace)
    if len(clocks) < 2:
        return trace
    calls = _grouped_calls(trace, patterns)
    by_part = calls.groupby("part").indices if len(calls) else {}
    parts = [replace(c, calls=calls.iloc[by_part[i]] if i in by_part else None) for i, c in enumerate(clocks)]
    alignment = clock_alignment(parts)
    ranks_of_part = {int(p): sorted(g["rank"].tolist()) for p, g in trace.ranks.groupby("part")}
    info = {**trace.info, 0: {**trace.info.get(0, {}), CLOCK_NOTE_KEY: clock_note(alignment, ranks_of_part)}}
    return replace(align_clocks(trace, [a.shift_ns for a in alignment]), info=info)


def _grouped_calls(trace: Trace, patterns: Patterns) -> pd.DataFrame:
    """The trace's calls on their parts' own clocks (call_times) with their process group's GROUP_KEYS as
    find_calls gives them, so that only calls of one group are matched across files."""
    calls, _ = call_times(trace, patterns)
    if calls.empty:
        return calls
    groups = fold_inferred(group_columns(trace, calls), world_size(trace.meta, len(trace.ranks)))
    return pd.concat([calls.drop(columns="group"), groups[GROUP_KEYS].set_axis(calls.index)], axis=1)
