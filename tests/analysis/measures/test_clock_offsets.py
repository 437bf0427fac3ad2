"""The clock-offset estimator against brute force: plain Python over the same collectives."""

from __future__ import annotations

import statistics

import numpy as np
import pandas as pd
import pytest

from analysis.measures.clock_offsets import (
    MAD_TO_SIGMA,
    MIN_ERROR_NS,
    collective_ends,
    estimate_offsets,
    offset_samples,
    robust_offset,
)


def calls_of(
    rng: np.random.Generator, ranks: list[int], shift: int, n_steps: int = 4, per_step: int = 30
) -> pd.DataFrame:
    """Per rank, per step, `per_step` all_reduce and 3 broadcast calls whose ends agree across ranks
    within a few µs, on a clock `shift` ns behind the reference."""
    rows = []
    for step in range(n_steps):
        for k in range(per_step + 3):
            op = "all_reduce" if k < per_step else "broadcast"
            end = 1_000_000_000 + step * 50_000_000 + k * 100_000
            for r in ranks:
                jitter = int(rng.normal(0, 1_500))
                rows.append((r, op, step, end - 40_000 - shift + jitter, end - shift + jitter))
    return pd.DataFrame(rows, columns=["rank", "op", "step", "start_ns", "end_ns"]).sample(frac=1, random_state=1)


def brute_ends(calls: pd.DataFrame) -> dict:
    """{(op, step, k): median end over the file's ranks}: the k-th call of op in step, by start, per rank."""
    per_rank: dict = {}
    for r, op, step, _start, end in sorted(calls.itertuples(index=False), key=lambda c: (c[0], c[3])):
        k = sum(1 for key in per_rank if key[:3] == (r, op, step))
        per_rank[(r, op, step, k)] = end
    out: dict = {}
    for (_, op, step, k), end in per_rank.items():
        out.setdefault((op, step, k), []).append(end)
    return {key: statistics.median(v) for key, v in out.items()}


@pytest.mark.parametrize("shift", [0, 2_000_000, -20_000_000, 7_777_777])
def test_estimate_equals_brute_force_and_recovers_the_shift(shift: int) -> None:
    rng = np.random.default_rng(abs(shift) % 97)
    a, b = calls_of(rng, [0, 1], 0), calls_of(rng, [2, 3], shift)
    ref, other = brute_ends(a), brute_ends(b)
    samples = [ref[k] - other[k] for k in ref if k in other]
    centre = statistics.median(samples)
    mad = statistics.median(abs(s - centre) for s in samples)
    est = estimate_offsets([collective_ends(a), collective_ends(b)])[1]
    assert est.samples == len(samples) == 4 * 33
    assert est.offset_ns == round(centre)
    assert est.residual_ns == round(mad)
    assert est.error_ns == max(round(MAD_TO_SIGMA * mad), MIN_ERROR_NS)
    assert abs(est.offset_ns - shift) <= est.error_ns  # the shift is found within its error
    assert sorted(offset_samples(collective_ends(a), collective_ends(b)).tolist()) == sorted(map(float, samples))


def test_outliers_do_not_move_the_median() -> None:
    samples = np.r_[np.full(50, 10_000.0), np.full(10, 5e7)]  # a sixth of the collectives mismatched
    est = robust_offset(samples)
    assert est.offset_ns == 10_000 and est.error_ns == MIN_ERROR_NS and est.samples == 60


def test_no_shared_collectives_gives_no_estimate() -> None:
    rng = np.random.default_rng(0)
    a = collective_ends(calls_of(rng, [0], 0))
    other = a.assign(op="send_recv")  # nothing in common
    assert estimate_offsets([a, other])[1].samples == 0
    assert estimate_offsets([a, None])[1].samples == 0
    assert estimate_offsets([]) == []
