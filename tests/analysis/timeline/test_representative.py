"""The representative step: closest to the run's medians of step time and exposed communication,
checked against a brute-force distance written here from the raw per-step rows."""

from __future__ import annotations

import statistics

import numpy as np
import pandas as pd
import pytest

from analysis.timeline.representative import representative_step


def _run(step_ms: list[list[float]], exposed: list[list[float]]) -> pd.DataFrame:
    """A per-step frame: rows[rank][step] of step time and exposed communication (ms)."""
    rows = [
        {"rank": r, "step": s, "step_ms": step_ms[r][s], "exposed_comm_ms": exposed[r][s]}
        for r in range(len(step_ms))
        for s in range(len(step_ms[r]))
    ]
    return pd.DataFrame(rows)


def _brute(frame: pd.DataFrame) -> tuple[int, int]:
    med_step = statistics.median(frame["step_ms"])
    med_exp = statistics.median(frame["exposed_comm_ms"])
    best = None
    for row in frame.itertuples():
        d = abs(row.step_ms - med_step) / med_step + abs(row.exposed_comm_ms - med_exp) / (med_exp or med_step)
        key = (d, row.step, row.rank)
        best = key if best is None or key < best else best
    return int(best[1]), int(best[2])


def test_a_step_where_one_rank_waited_long_is_not_chosen():
    # Like flat on CPU: most steps expose 18-47 ms; in step 3 rank 0 waits ~500 ms for rank 1. Rank 0 is the
    # slower rank and step 3 is its median step by time, so "the slowest rank's median step" would show it.
    step_ms = [[300, 310, 305, 830, 900, 950, 1000], [290, 300, 295, 820, 315, 312, 308]]
    exposed = [[20, 30, 25, 534, 47, 40, 45], [18, 28, 22, 40, 35, 30, 33]]
    frame = _run(step_ms, exposed)
    slowest = max(range(2), key=lambda r: sum(step_ms[r]) / len(step_ms[r]))
    by_time = sorted(range(7), key=lambda s: step_ms[slowest][s])
    assert (by_time[3], slowest) == (3, 0)  # that rule's pick: the step where rank 0 waited
    step, rank = representative_step(frame)
    assert (step, rank) != (3, 0)
    assert (step, rank) == _brute(frame)
    row = frame.query("step == @step and rank == @rank").iloc[0]
    assert row.exposed_comm_ms < 50 and row.step_ms < 400  # a typical step, as the medians say


@pytest.mark.parametrize("seed", range(20))
def test_matches_brute_force_on_random_runs(seed):
    rng = np.random.default_rng(seed)
    ranks, steps = int(rng.integers(1, 4)), int(rng.integers(1, 9))
    step_ms = rng.uniform(50, 500, (ranks, steps)).round(1).tolist()
    exposed = (rng.uniform(0, 80, (ranks, steps)) * rng.integers(0, 2, (ranks, steps))).round(1).tolist()
    frame = _run(step_ms, exposed)
    assert representative_step(frame) == _brute(frame)


def test_no_exposed_communication_uses_step_time_alone_and_no_steps_gives_none():
    frame = _run([[100, 140, 120]], [[0, 0, 0]])
    assert representative_step(frame) == (2, 0)  # 120 ms is the median
    assert representative_step(frame.iloc[0:0]) is None
    assert representative_step(frame.assign(step=np.nan)) is None
