"""The clock-offset estimator against brute force: plain Python over the same collectives."""

from __future__ import annotations

import statistics

import numpy as np
import pandas as pd
import pytest

from analysis.run.clocks import (
    MAD_TO_SIGMA,
    MIN_ERROR_NS,
    MIN_PER_ORDER,
    collective_times,
    estimate_offsets,
    paired_differences,
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


def brute_times(calls: pd.DataFrame) -> dict:
    """{(op, step, k): (median start, median end) over the file's ranks}: the k-th call of op in step,
    by start, per rank."""
    per_rank: dict = {}
    for r, op, step, start, end in sorted(calls.itertuples(index=False), key=lambda c: (c[0], c[3])):
        k = sum(1 for key in per_rank if key[:3] == (r, op, step))
        per_rank[(r, op, step, k)] = (start, end)
    out: dict = {}
    for (_, op, step, k), times in per_rank.items():
        out.setdefault((op, step, k), []).append(times)
    return {key: (statistics.median(t[0] for t in v), statistics.median(t[1] for t in v)) for key, v in out.items()}


def brute_estimate(ref: dict, other: dict) -> tuple[float, float, float, int]:
    """(offset, skew, residual, samples) as the module docstring defines them, in plain Python."""
    pairs = [(ref[k][1] - other[k][1], ref[k][0] - other[k][0]) for k in ref if k in other]
    ends = [e for e, _ in pairs]
    coarse = statistics.median(ends)
    error = max(round(MAD_TO_SIGMA * statistics.median(abs(e - coarse) for e in ends)), MIN_ERROR_NS)
    first_last = [e for e, s in pairs if s - round(coarse) > error]
    other_last = [e for e, s in pairs if s - round(coarse) < -error]
    if min(len(first_last), len(other_last)) < MIN_PER_ORDER:
        return coarse, 0.0, statistics.median(abs(e - coarse) for e in ends), len(pairs)
    late, early = statistics.median(first_last), statistics.median(other_last)
    centre, skew = (late + early) / 2, (late - early) / 2
    signed = [e - centre - (skew if s - round(coarse) > 0 else -skew) for e, s in pairs]
    return centre, skew, statistics.median(abs(x) for x in signed), len(pairs)


@pytest.mark.parametrize("shift", [0, 2_000_000, -20_000_000, 7_777_777])
def test_estimate_equals_brute_force_and_recovers_the_shift(shift: int) -> None:
    rng = np.random.default_rng(abs(shift) % 97)
    a, b = calls_of(rng, [0, 1], 0), calls_of(rng, [2, 3], shift)
    centre, skew, mad, n = brute_estimate(brute_times(a), brute_times(b))
    est = estimate_offsets([collective_times(a), collective_times(b)])[1]
    assert est.samples == n == 4 * 33
    assert (est.offset_ns, est.skew_ns, est.residual_ns) == (round(centre), round(skew), round(mad))
    assert est.error_ns == max(round(MAD_TO_SIGMA * mad), MIN_ERROR_NS)
    assert abs(est.offset_ns - shift) <= est.error_ns  # the shift is found within its error
    ends, starts = paired_differences(collective_times(a), collective_times(b))
    assert sorted(ends.tolist()) == sorted(ref[1] - other[1] for ref, other in _pairs(a, b))
    assert sorted(starts.tolist()) == sorted(ref[0] - other[0] for ref, other in _pairs(a, b))


def _pairs(a: pd.DataFrame, b: pd.DataFrame) -> list:
    ref, other = brute_times(a), brute_times(b)
    return [(ref[k], other[k]) for k in ref if k in other]


def skewed_pair(rng: np.random.Generator, shift: int, p_first_last: float, n: int = 400) -> tuple:
    """Two one-rank files sharing n collectives, the second on a clock `shift` ns behind: the rank
    that arrives last (the first with probability p_first_last, 2-50 µs after the other) ends 500 ns
    before the other, as on the real H100 pairs; 100 ns of jitter."""
    first_last = rng.random(n) < p_first_last
    end = 1_000_000_000 + np.arange(n) * 200_000
    gap = rng.integers(2_000, 50_000, n)
    start = end - 60_000
    ends = np.where(first_last, [end - 500, end], [end, end - 500]) + rng.normal(0, 100, (2, n)).round()
    starts = np.where(first_last, [start, start - gap], [start - gap, start])

    def frame(i: int, behind: int) -> pd.DataFrame:
        return pd.DataFrame(
            {
                "rank": i,
                "op": "all_reduce",
                "step": 0,
                "start_ns": starts[i] - behind,
                "end_ns": ends[i].astype(np.int64) - behind,
            }
        )

    return frame(0, 0), frame(1, shift), first_last


@pytest.mark.parametrize("p_first_last", [0.85, 0.15, 0.5])
@pytest.mark.parametrize("shift", [0, 10_000_000, -3_000_000])
def test_the_arrival_order_skew_cancels(shift: int, p_first_last: float) -> None:
    """One rank arriving last more often biases the plain median of the end differences by up to the
    skew; the balanced estimate is off by no more than the jitter."""
    a, b, _ = skewed_pair(np.random.default_rng(7), shift, p_first_last)
    est = estimate_offsets([collective_times(a), collective_times(b)])[1]
    assert abs(est.offset_ns - shift) < 30 and abs(est.skew_ns + 500) < 30
    plain = robust_offset(paired_differences(collective_times(a), collective_times(b))[0])
    if p_first_last != 0.5:
        assert abs(plain.offset_ns - shift) > 200  # what the estimate was before


def test_one_arrival_order_only_falls_back_to_the_median() -> None:
    a, b, _ = skewed_pair(np.random.default_rng(3), 5_000_000, 1.0)
    est = estimate_offsets([collective_times(a), collective_times(b)])[1]
    plain = robust_offset(paired_differences(collective_times(a), collective_times(b))[0])
    assert est == plain and est.skew_ns == 0


def test_outliers_do_not_move_the_median() -> None:
    samples = np.r_[np.full(50, 10_000.0), np.full(10, 5e7)]  # a sixth of the collectives mismatched
    est = robust_offset(samples)
    assert est.offset_ns == 10_000 and est.error_ns == MIN_ERROR_NS and est.samples == 60


def test_no_shared_collectives_gives_no_estimate() -> None:
    rng = np.random.default_rng(0)
    a = collective_times(calls_of(rng, [0], 0))
    other = a.assign(op="send_recv")  # nothing in common
    assert estimate_offsets([a, other])[1].samples == 0
    assert estimate_offsets([a, None])[1].samples == 0
    assert estimate_offsets([]) == []
