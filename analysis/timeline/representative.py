"""The representative step of a run: the one (step, rank) a page shows when it shows one.

It is the step closest to the run's medians, over every rank and step, of the two figures the
report's table leads with: step time and exposed communication. Distance is the sum of each figure's
relative gap to its median, |step_ms / median - 1| + |exposed_comm_ms / median - 1|; where the
median of exposed communication is zero (none exposed in most steps) its gap is measured in units of
the median step time instead. A step where one rank waited long for the other sits far from both
medians and is never chosen while a typical one exists. Ties go to the lowest step, then rank.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

RULE = (
    "the step closest to the run's medians of step time and exposed communication over all ranks and steps "
    "(distance: |step time / median − 1| + |exposed comm / median − 1|)"
)


def _gap(values: pd.Series, median: float, fallback: float) -> np.ndarray:
    """|value / median - 1| as an array; measured in `fallback` units where the median is 0."""
    scale = median if median > 0 else fallback
    if not scale > 0:
        return np.zeros(len(values))
    return np.abs(values.to_numpy(dtype=float) - median) / scale


def representative_step(steps: pd.DataFrame) -> tuple[int, int] | None:
    """(step, rank) closest to the run's medians of step_ms and exposed_comm_ms (the module's rule),
    from the analysis' per-step frame; None when it has no numbered step with a step time."""
    known = steps.loc[steps["step"].notna() & steps["step_ms"].notna()]
    if known.empty:
        return None
    step_ms = known["step_ms"].astype(float)
    median_step = float(step_ms.median())
    distance = _gap(step_ms, median_step, median_step)
    if "exposed_comm_ms" in known:
        exposed = known["exposed_comm_ms"].astype(float).fillna(0.0)
        distance = distance + _gap(exposed, float(exposed.median()), median_step)
    step, rank = known["step"].to_numpy(), known["rank"].to_numpy()
    best = np.lexsort((rank, step, distance))[0]  # the nearest; ties: the lowest step, then rank
    return int(step[best]), int(rank[best])


SWITCH = (
    "Another step or rank: each run's timeline page ('whole run' shows every step of every rank), or "
    "python -m analysis.timeline TRACE --step N --rank R."
)
