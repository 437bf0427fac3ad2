"""Clock offsets between the files of one run, estimated from the collectives the ranks shared.

The ranks' kernels of one NCCL collective end together (within microseconds: the last chunk's
arrival releases every rank), and so do the ranks' host ranges of one gloo collective. So for each
collective both files saw, the difference of its end times on the two files' clocks is one sample
of their clock offset. Collectives are matched as the collectives view pairs them (pairing.pair):
the k-th call of an op in a step is one collective on every rank. A file holding several ranks
contributes the median of its ranks' ends.

`estimate_offsets(ends)`: per file, the median of its samples against the first file (robust: a
few mismatched or straggling collectives do not move it), the spread of the samples (1.4826 x
their median absolute deviation, the standard deviation of normal samples) as its error, the
number of samples and the residual (median |difference - offset|). Pure numpy, no loop over
collectives.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

MAD_TO_SIGMA = 1.4826  # median absolute deviation -> standard deviation of normal samples
MIN_ERROR_NS = 1_000  # clocks are not trusted to agree better than 1 µs from a handful of samples


@dataclass(frozen=True)
class OffsetEstimate:
    """One file's clock against the first file's: ns to add to its times (`offset_ns`), its error
    (`error_ns`, >= MIN_ERROR_NS), the median |sample - offset| (`residual_ns`) and the number of
    shared collectives it came from (`samples`; 0: no estimate, offset and error are 0)."""

    offset_ns: int
    error_ns: int
    residual_ns: int
    samples: int


def collective_ends(calls: pd.DataFrame) -> pd.DataFrame:
    """One row per collective of one file (op, step, seq): the median end (ns, the file's clock) over
    the file's ranks. `calls`: rank, op, step, start_ns, end_ns (collective_calls' frame)."""
    ordered = calls.sort_values(["rank", "start_ns"], kind="stable")
    seq = ordered.groupby(["rank", "op", "step"], sort=False).cumcount().to_numpy()
    keyed = pd.DataFrame(
        {
            "op": ordered["op"].astype(str).to_numpy(),
            "step": ordered["step"].to_numpy(),
            "seq": seq,
            "end_ns": ordered["end_ns"].to_numpy(np.int64),
        }
    )
    return keyed.groupby(["op", "step", "seq"], sort=False)["end_ns"].median().reset_index()


def offset_samples(reference: pd.DataFrame, other: pd.DataFrame) -> np.ndarray:
    """Per collective in both (collective_ends frames): reference end minus other end, in ns."""
    both = reference.merge(other, on=["op", "step", "seq"], suffixes=("_ref", "_other"))
    return (both["end_ns_ref"].to_numpy(np.float64) - both["end_ns_other"].to_numpy(np.float64)).astype(np.float64)


def robust_offset(samples: np.ndarray) -> OffsetEstimate:
    """Median of the samples, with the MAD-based error and the residual (see the module docstring)."""
    samples = np.asarray(samples, dtype=np.float64)
    if samples.size == 0:
        return OffsetEstimate(0, 0, 0, 0)
    centre = float(np.median(samples))
    deviation = np.abs(samples - centre)
    mad = float(np.median(deviation))
    error = max(round(MAD_TO_SIGMA * mad), MIN_ERROR_NS)
    return OffsetEstimate(round(centre), error, round(mad), int(samples.size))


def estimate_offsets(ends: list[pd.DataFrame | None]) -> list[OffsetEstimate]:
    """Per file (collective_ends frames, None when a file has no calls), its clock offset against the
    first file; the first file's is 0 with no samples."""
    reference = ends[0] if ends else None
    out = [OffsetEstimate(0, 0, 0, 0)] if ends else []
    for other in ends[1:]:
        if reference is None or other is None or reference.empty or other.empty:
            out.append(OffsetEstimate(0, 0, 0, 0))
        else:
            out.append(robust_offset(offset_samples(reference, other)))
    return out
