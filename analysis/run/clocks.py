"""The one place a run's files get one clock: `clock_shifts(parts) -> [ns per part]`, `align_clocks(trace)`.

Each file of a run (nsys export or torch.profiler JSON) has its own clock. The readers return every
file's times on that file's own clock and record, per part, what the file says about it (its
UTC-minus-trace-clock offset, `info[part][CLOCK_OFFSET_KEY]`: nsys TARGET_INFO_SESSION_START_TIME,
Kineto baseTimeNanoseconds). `clock_shifts` decides how far to move each part onto the first
part's clock; every path that merges files uses it: the one-piece load (`align_clocks`, called by
loaded_run.load_trace) and the per-file merge of --jobs/--dask (rank_merge.combine). Where the parts'
collective calls are known, `clock_alignment` checks the recorded clocks against an estimate from
the collectives the ranks shared (below) and uses the estimate when they disagree by more than its
error; `clock_note` says what was done, per file.

The estimate from the collectives: the ranks' kernels of one NCCL collective end together (within
microseconds: the last chunk's arrival releases every rank), and so do the ranks' host ranges of one
gloo collective. So for each collective both files saw, the difference of its end times on the two
files' clocks is one sample of their clock offset. Collectives are matched as the collectives view
pairs them (call_groups.pair): the k-th call of an op in a step of a process group (its name with its
members: call_groups.py) is one collective on every member, so calls of two groups are never matched
(two HSDP shard groups' reduce-scatters end at different times). A file holding several ranks
contributes the median of its ranks' starts and ends per collective.

"Together" is not "at once": which rank ends first depends on which one arrived last. On the real
H100 pairs (two ranks, one GPU, so the true offset is 0) the rank that started a collective last
ends it about 0.5 µs before the other, and one rank arrives last far more often than the other
(908 of 1096 calls in the naive run), so the plain median of the end differences is 0.5 µs off;
summed over a step's 219 calls that moved the per-step wait by over 100 µs. The estimate therefore
splits the collectives by arrival order (start gap, on the coarse median's clock, beyond that
median's error) and takes the midpoint of the two groups' medians: the skew tied to arrival order
cancels, whichever rank arrives last more often.

`estimate_offsets(times)`: per file, that offset against the first file (falling back to the plain
median when either arrival order has fewer than MIN_PER_ORDER collectives), the spread of the
samples about it (1.4826 x their median absolute deviation once the skew is removed: the standard
deviation of normal samples) as its error, the number of samples, the residual (that median
absolute deviation) and the skew. Pure numpy, no loop over collectives.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from analysis.measure.call_groups import fold_inferred, group_columns, world_size
from analysis.measure.collective_calls import call_times
from analysis.trace.frames import CLOCK_NOTE_KEY, CLOCK_OFFSET_KEY, Trace
from analysis.trace.patterns import Patterns

MAD_TO_SIGMA = 1.4826  # median absolute deviation -> standard deviation of normal samples
MIN_ERROR_NS = 1_000  # clocks are not trusted to agree better than 1 µs from a handful of samples
MIN_PER_ORDER = 8  # collectives of each arrival order needed to measure the arrival-order skew
GROUP_KEYS = ["group", "group_ranks"]  # a call's process group, where the calls carry it (call_groups.py)


@dataclass(frozen=True)
class OffsetEstimate:
    """One file's clock against the first file's: ns to add to its times (`offset_ns`), its error
    (`error_ns`, >= MIN_ERROR_NS), the median |sample - offset - skew| (`residual_ns`), the number of
    shared collectives it came from (`samples`; 0: no estimate, offset and error are 0) and the
    arrival-order skew (`skew_ns`: the first file's end minus the other's, beyond the offset, where
    the first file arrived last, and minus that where the other did; 0 when not measured)."""

    offset_ns: int
    error_ns: int
    residual_ns: int
    samples: int
    skew_ns: int = 0


def collective_times(calls: pd.DataFrame) -> pd.DataFrame:
    """One row per collective of one file ([group, group_ranks,] op, step, seq): the median start and end (ns,
    the file's clock) over the file's ranks. `calls`: rank, op, step, start_ns, end_ns and, where known, the
    GROUP_KEYS (collective_calls' frame)."""
    ordered = calls.sort_values(["rank", "start_ns"], kind="stable")
    groups = {c: ordered[c].astype(str).to_numpy() for c in GROUP_KEYS if c in ordered}
    keyed = pd.DataFrame(
        {
            "rank": ordered["rank"].to_numpy(),
            **groups,
            "op": ordered["op"].astype(str).to_numpy(),
            "step": ordered["step"].to_numpy(),
            "start_ns": ordered["start_ns"].to_numpy(np.int64),
            "end_ns": ordered["end_ns"].to_numpy(np.int64),
        }
    )
    keyed["seq"] = keyed.groupby(["rank", *groups, "op", "step"], sort=False).cumcount().to_numpy()
    key = [*groups, "op", "step", "seq"]
    return keyed.groupby(key, sort=False)[["start_ns", "end_ns"]].median().reset_index()


def paired_differences(reference: pd.DataFrame, other: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Per collective in both (collective_times frames, matched on their group, op, step and seq): (reference
    end minus other end, reference start minus other start), in ns."""
    key = [c for c in [*GROUP_KEYS, "op", "step", "seq"] if c in reference and c in other]
    both = reference.merge(other, on=key, suffixes=("_ref", "_other"))
    ref, other_ = (both[[f"start_ns_{s}", f"end_ns_{s}"]].to_numpy(np.float64) for s in ("ref", "other"))
    return ref[:, 1] - other_[:, 1], ref[:, 0] - other_[:, 0]


def robust_offset(samples: np.ndarray) -> OffsetEstimate:
    """Median of the samples, with the MAD-based error and the residual (the module docstring says how)."""
    samples = np.asarray(samples, dtype=np.float64)
    if samples.size == 0:
        return OffsetEstimate(0, 0, 0, 0)
    centre = float(np.median(samples))
    mad = float(np.median(np.abs(samples - centre)))
    return OffsetEstimate(round(centre), max(round(MAD_TO_SIGMA * mad), MIN_ERROR_NS), round(mad), int(samples.size))


def balanced_offset(end_diff: np.ndarray, start_diff: np.ndarray) -> OffsetEstimate:
    """The offset with the arrival-order skew cancelled (module docstring): the midpoint of the
    end-difference medians of the collectives the first file arrived last at and of those the other
    did; the plain median (robust_offset) when either order has fewer than MIN_PER_ORDER."""
    coarse = robust_offset(end_diff)
    gap = np.asarray(start_diff, dtype=np.float64) - coarse.offset_ns  # > 0: the first file arrived last
    first_last, other_last = gap > coarse.error_ns, gap < -coarse.error_ns
    if min(int(first_last.sum()), int(other_last.sum())) < MIN_PER_ORDER:
        return coarse
    late, early = float(np.median(end_diff[first_last])), float(np.median(end_diff[other_last]))
    centre, skew = (late + early) / 2, (late - early) / 2
    mad = float(np.median(np.abs(end_diff - centre - np.where(gap > 0, skew, -skew))))
    error = max(round(MAD_TO_SIGMA * mad), MIN_ERROR_NS)
    return OffsetEstimate(round(centre), error, round(mad), int(end_diff.size), round(skew))


def estimate_offsets(times: list[pd.DataFrame | None]) -> list[OffsetEstimate]:
    """Per file (collective_times frames, None when a file has no calls), its clock offset against
    the first file; the first file's is 0 with no samples."""
    reference = times[0] if times else None
    out = [OffsetEstimate(0, 0, 0, 0)] if times else []
    for other in times[1:]:
        if reference is None or other is None or reference.empty or other.empty:
            out.append(OffsetEstimate(0, 0, 0, 0))
        else:
            out.append(balanced_offset(*paired_differences(reference, other)))
    return out


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
    the collectives (estimate_offsets; `estimate.samples` 0: none), and the shift used."""

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
