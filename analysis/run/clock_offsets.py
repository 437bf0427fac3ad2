"""Clock offsets between the files of one run, estimated from the collectives the ranks shared.

The ranks' kernels of one NCCL collective end together (within microseconds: the last chunk's
arrival releases every rank), and so do the ranks' host ranges of one gloo collective. So for each
collective both files saw, the difference of its end times on the two files' clocks is one sample
of their clock offset. Collectives are matched as the collectives view pairs them (call_groups.pair):
the k-th call of an op in a step of a process group (its name with its members: call_groups.py) is one
collective on every member, so calls of two groups are never matched (two HSDP shard groups' reduce-scatters
end at different times). A file holding several ranks contributes the median of its ranks' starts and
ends per collective.

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

from dataclasses import dataclass

import numpy as np
import pandas as pd

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
    """Median of the samples, with the MAD-based error and the residual (see the module docstring)."""
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
