"""Units chosen to fit the values drawn: a chart of rates reads 120 KB/s, not 0.00012 GB/s."""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

RATE_UNITS = (("GB/s", 1e9), ("MB/s", 1e6), ("KB/s", 1e3), ("B/s", 1.0))  # largest first; decimal, as busbw is


def rate_unit(bytes_per_s: ArrayLike) -> tuple[str, float]:
    """(unit, bytes per second in one unit): the largest of RATE_UNITS in which the median of the finite
    positive values is at least 1; GB/s when there are none."""
    values = np.asarray(bytes_per_s, dtype=float).ravel()
    values = values[np.isfinite(values) & (values > 0)]
    if values.size == 0:
        return RATE_UNITS[0]
    typical = float(np.median(values))
    return next((unit for unit in RATE_UNITS if typical >= unit[1]), RATE_UNITS[-1])
