"""The rate unit fits the values: the largest unit in which the typical value is at least 1."""

from __future__ import annotations

import math

import pytest

from analysis.render.units import rate_unit


@pytest.mark.parametrize(
    ("values", "unit"),
    [
        ([25e9, 180e9, 3e9], "GB/s"),  # NVLink-class collectives
        ([1e9], "GB/s"),  # exactly one unit
        ([999e6, 2e9, 4e8], "MB/s"),  # the median below 1 GB/s
        ([1.2e5, 8e4, 3e5], "KB/s"),  # gloo on CPU: what read as "100µ GB/s"
        ([12.0, 900.0, 5.0], "B/s"),
        ([0.5], "B/s"),  # below one byte per second: the smallest unit
        ([], "GB/s"),
        ([math.nan, 0.0, -1.0], "GB/s"),  # nothing to measure: the default
        ([math.nan, 3e6, math.inf], "MB/s"),  # only the finite positive values count
    ],
)
def test_unit_across_magnitudes(values, unit):
    name, scale = rate_unit(values)
    assert name == unit
    finite = sorted(v for v in values if math.isfinite(v) and v > 0)
    if finite and name != "B/s":  # the typical value reads between 1 and 1000 in the chosen unit
        middle = (
            finite[len(finite) // 2]
            if len(finite) % 2
            else (finite[len(finite) // 2 - 1] + finite[len(finite) // 2]) / 2
        )
        assert 1 <= middle / scale < 1000 or name == "GB/s"
