"""Metrics on hand-made exports (see overlap_fixtures.py for the hand computation)."""

import math

import pytest

from analysis import analyze
from tests.analysis.overlap_fixtures import write_cpu_ddp_wait, write_cpu_only, write_two_ranks


def ns(ms: float) -> int:
    return round(ms * 1e6)


def row_ns(row, keys):
    return {k: ns(row[k]) for k in keys}


TIMES = ["step_ms", "backward_ms", "compute_ms", "comm_ms", "overlap_ms", "backward_overlap_ms", "exposed_comm_ms"]


@pytest.fixture(
    scope="module",  # analysed once per flavour: the tests only read the result
    params=[("2026", False), ("2022", True)],
    ids=["nsys2026-inline-text", "nsys2022-registered-text"],
)
def two_ranks(request, tmp_path_factory):
    flavour, registered = request.param
    path = tmp_path_factory.mktemp(f"two_{flavour}") / "two.sqlite"
    return analyze(write_two_ranks(path, flavour=flavour, registered=registered))


def test_rank_numbers_come_from_run_metadata(two_ranks):
    totals = two_ranks.totals.set_index("rank")
    assert totals.loc[1, "pid"] == 100 and totals.loc[1, "device"] == 0
    assert totals.loc[0, "pid"] == 200 and totals.loc[0, "device"] == 1
    assert set(two_ranks.summary["implementation"]) == {"fixture"}


def test_rank_a_whole_step_by_hand(two_ranks):
    a = two_ranks.steps[two_ranks.steps["rank"] == 1]
    assert len(a) == 1 and a.iloc[0]["step"] == 0
    row = a.iloc[0]
    # the last step lasts until the GPU work launched in it ends (k6 at 1300), not its CPU end (1000)
    assert row_ns(row, TIMES) == {
        "step_ms": 1300,
        "backward_ms": 350,
        "compute_ms": 700,
        "comm_ms": 600,
        "overlap_ms": 300,
        "backward_overlap_ms": 250,
        "exposed_comm_ms": 300,
    }
    assert row["overlap_pct"] == pytest.approx(50.0)
    assert (row["comm_kernels"], row["compute_kernels"], row["comm_copies"], row["comm_ranges"]) == (3, 5, 1, 2)


def test_rank_b_per_step_overlap_reaches_into_the_next_step(two_ranks):
    b = two_ranks.steps[two_ranks.steps["rank"] == 0].set_index("step")
    assert row_ns(b.loc[0], TIMES) == {
        "step_ms": 500,
        "backward_ms": 200,
        "compute_ms": 200,
        "comm_ms": 400,
        "overlap_ms": 100,
        "backward_overlap_ms": 100,
        "exposed_comm_ms": 300,
    }
    assert ns(b.loc[1, "comm_ms"]) == 0 and ns(b.loc[1, "compute_ms"]) == 200
    assert math.isnan(b.loc[1, "overlap_pct"])  # no communication: no percentage


def test_totals_cover_the_whole_capture(two_ranks):
    t = two_ranks.totals.set_index("rank")
    assert row_ns(t.loc[0], TIMES) == {
        "step_ms": 700,
        "backward_ms": 700,
        "compute_ms": 400,
        "comm_ms": 400,
        "overlap_ms": 100,
        "backward_overlap_ms": 100,
        "exposed_comm_ms": 300,
    }
    assert ns(t.loc[1, "step_ms"]) == 1280  # memset at 20 .. last comm kernel at 1300


def test_summary_averages_steps_of_all_ranks(two_ranks):
    s = two_ranks.summary.iloc[0]
    assert (s["ranks"], s["steps"], s["source"]) == (2, 3, "kernels")
    assert s["comm_ms"] * 1e6 == pytest.approx((600 + 400 + 0) / 3)
    assert s["overlap_pct"] == pytest.approx(100 * (300 + 100) / (600 + 400))


def test_skip_steps_drops_each_ranks_first_steps(tmp_path):
    result = analyze(write_two_ranks(tmp_path / "two.sqlite"), skip_steps=1)
    assert result.steps[["rank", "step"]].values.tolist() == [[0, 1]]
    assert len(result.totals) == 2  # totals are over the whole capture regardless


def test_cpu_only_export_uses_nvtx_ranges(tmp_path):
    result = analyze(write_cpu_only(tmp_path / "cpu.sqlite"))
    row = result.steps.iloc[0]
    assert result.summary.iloc[0]["source"] == "ranges"
    assert result.summary.iloc[0]["profiler"] == "nsys 2022.4.2.1"
    assert row_ns(row, TIMES) == {
        "step_ms": 1000,
        "backward_ms": 500,
        "compute_ms": 900,
        "comm_ms": 450,
        "overlap_ms": 400,
        "backward_overlap_ms": 350,
        "exposed_comm_ms": 50,
    }
    assert row["overlap_pct"] == pytest.approx(400 / 450 * 100)
    assert (row["comm_kernels"], row["compute_kernels"], row["comm_ranges"]) == (0, 0, 3)


def test_cpu_only_wait_inside_backward_is_not_compute(tmp_path):
    row = analyze(write_cpu_ddp_wait(tmp_path / "ddp.sqlite")).steps.iloc[0]
    assert row_ns(row, ["compute_ms", "comm_ms", "overlap_ms", "backward_overlap_ms", "exposed_comm_ms"]) == {
        "compute_ms": 850,
        "comm_ms": 350,
        "overlap_ms": 200,
        "backward_overlap_ms": 200,
        "exposed_comm_ms": 150,
    }


def test_patterns_are_overridable(tmp_path):
    from analysis.trace.patterns import Patterns

    path = write_two_ranks(tmp_path / "two.sqlite")
    # nothing is a comm kernel by name any more: only the copy and the blocking-range kernel remain comm
    result = analyze(path, patterns=Patterns(comm_kernel="^no-such-kernel$"))
    a = result.totals.set_index("rank").loc[1]
    assert (a["comm_kernels"], a["comm_copies"]) == (1, 1)
    assert ns(a["comm_ms"]) == 150  # [1100,1150) + [1200,1300)
    # without step ranges the whole capture is one window
    whole = analyze(path, patterns=Patterns(step="^no-such-step$"))
    assert whole.steps["step"].isna().all() and len(whole.steps) == 2


def test_summarise_each_step_is_each_steps_summary():
    import numpy as np
    import pandas as pd

    from analysis.overlap.metrics import summarise, summarise_each_step

    rng = np.random.default_rng(3)
    steps = pd.DataFrame({"rank": [1, 0, 1, 0, 0, 1, 0], "step": [4, 2, 2, 4, 7, 7, 2]})
    for column in ("step_ms", "comm_ms", "overlap_ms", "exposed_comm_ms"):
        steps[column] = rng.uniform(0, 10, len(steps))
    steps.loc[[1, 3], "overlap_ms"] = np.nan  # the means skip missing values
    each = summarise_each_step(steps)
    assert sorted(each) == [2, 4, 7]
    for step, figures in each.items():
        rows = [r for r in steps.to_dict("records") if r["step"] == step]
        assert (figures["ranks"], figures["steps"]) == (len({r["rank"] for r in rows}), len(rows))
        for column in ("step_ms", "comm_ms", "overlap_ms"):
            kept = [r[column] for r in rows if not math.isnan(r[column])]
            assert figures[column] == pytest.approx(sum(kept) / len(kept))
        assert figures["backward_ms"] is None  # not a column of the frame
        assert figures == pytest.approx(summarise(steps[steps["step"] == step]), nan_ok=True)
        assert repr(figures) == repr(summarise(steps[steps["step"] == step]))  # bit for bit, in the same order
