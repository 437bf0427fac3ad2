"""The what-if's tables hold together, on the synthetic runs worked by hand (test_advice.py, sharded/
test_shard_advice.py): each candidate is a change from the recorded setting, the replay of the recorded
setting is checked against the measured run before any candidate, a bound is never above the replay it
bounds, settings that give the same layout are one row, and nothing unfitted reads "n/a"."""

from __future__ import annotations

import numpy as np
import pytest

from analysis.advise.advice import advise
from analysis.advise.buckets.predict import layouts
from analysis.advise.buckets.replay import RecordedRun
from analysis.advise.command import render_table
from tests.analysis.advise.sharded.test_shard_advice import STEP, write_fsdp_run
from tests.analysis.advise.test_advice import MIB, PARAMS, write_overlap_run


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tables")
    write_overlap_run(folder / "overlap.sqlite")
    write_fsdp_run(folder / "fsdp.sqlite")
    return folder


@pytest.fixture(scope="module")
def buckets_json(runs):
    (result,) = advise([runs / "overlap.sqlite"], [0.1, 100.0, 200.0])
    return result.to_json()


@pytest.fixture(scope="module")
def fsdp_json(runs):
    (result,) = advise([runs / "fsdp.sqlite"])
    return result.to_json()


def test_each_bucket_candidate_is_its_change_from_the_recorded_layout(buckets_json):
    run = buckets_json
    measured = run["measured_step_ms"]
    for c in run["candidates"]:
        # anchored: the recorded step plus the change, the change as a share of the measured step
        assert c["predicted_step_ms"] == pytest.approx(measured + c["predicted_change_ms"], abs=2e-3)
        assert c["predicted_change_pct"] == pytest.approx(100 * c["predicted_change_ms"] / measured, abs=2e-3)
    by = {c["bucket_mb"]: c for c in run["candidates"]}
    # 0.1 MiB is one bucket per parameter: the recorded layout, no change
    assert by[0.1]["predicted_change_ms"] == 0 and by[0.1]["predicted_change_ms_err"] == 0
    # 100 MiB: head.weight alone, then the other three launched when the last is ready (6 ms), lasting
    # 100 us + their bytes and flags at 1 ns a byte, past backward's end (7 ms)
    end_ms = 6 + (100_000 + MIB + MIB // 2 + MIB // 4 + 3 * 4) / 1e6
    assert by[100.0]["predicted_change_ms"] == pytest.approx(end_ms - 7, abs=2e-3)
    assert run["absolute_figures"].startswith("under the profiler")


def test_the_replay_of_the_recorded_layout_is_checked_and_bounds_stay_below_it(buckets_json):
    check = buckets_json["replay_check"]
    assert check["step"]["within"] and check["exposed_comm"]["within"]
    assert check["step"]["replayed_ms"] == pytest.approx(buckets_json["measured_step_ms"])
    assert buckets_json["floor_step_ms"] <= buckets_json["ideal_step_ms"] <= buckets_json["measured_step_ms"]


def test_sizes_giving_the_same_buckets_are_one_row_that_says_so(buckets_json):
    by = {c["bucket_mb"]: c for c in buckets_json["candidates"]}
    assert by[100.0]["same_layout_mb"] == by[200.0]["same_layout_mb"] == [100.0, 200.0]
    assert by[0.1]["same_layout_mb"] == [0.1]
    text = render_table([buckets_json])
    rows = [ln for ln in text.splitlines() if ln.lstrip().startswith(("0.1 ", "100", "200"))]
    assert len(rows) == 2 and "100-200 MiB: same 2 buckets" in rows[1]
    header = next(ln for ln in text.splitlines() if ln.lstrip().startswith("bucket MiB"))
    assert header.index("step change ms") < header.index("step change %") < header.index("step under profiler ms")
    # the replay's check comes before the table
    lines = text.splitlines()
    assert lines.index(next(ln for ln in lines if "replay of the recorded layout" in ln)) < lines.index(header)


def test_the_layouts_group_sizes_past_the_whole_gradient():
    sizes = np.array([b for _, b, _ in PARAMS], dtype=float)
    run = RecordedRun(*(np.zeros((1, 1)),) * 5, np.zeros((1, 1, 4)), sizes, 4, 0.0)
    got = layouts(run, [0.1, 1.0, 10.0, 25.0, 100.0], "before")
    # plain Python: a size at or over the model's gradients (3.75 MiB) past the 1 MiB first bucket holds
    # the rest in one bucket, whatever the size
    assert list(got.values()) == [[0.1], [1.0], [10.0, 25.0, 100.0]]


def test_each_sharded_candidate_is_its_change_and_the_bound_is_below_the_replay(fsdp_json):
    run = fsdp_json
    by = {(c["prefetch"], c["separate_reduce_scatter"]): c for c in run["candidates"]}
    assert by[(2, True)]["predicted_change_ms"] == pytest.approx(-4)
    assert by[(2, True)]["predicted_change_pct"] == pytest.approx(-400 / STEP, abs=1e-3)
    assert by[(2, False)]["predicted_change_ms"] == 0
    assert run["replay_within"] and run["ideal_replayed_ms"] <= run["replayed_step_ms"]
    assert run["ideal_step_ms"] <= run["measured_step_ms"]
    # depths 3 and 4 replay the same schedule as depth 2 with separate reduce-scatters: one row
    same = by[(2, True)]["same_schedule"]
    assert {(s["prefetch"], s["separate_reduce_scatter"]) for s in same} == {
        (2, True),
        (3, False),
        (3, True),
        (4, False),
        (4, True),
    }
    text = render_table([run])
    rows = [ln for ln in text.splitlines() if ln.lstrip()[:2] in ("1 ", "2 ", "3 ", "4 ")]
    assert len(rows) == 4 and "same schedule as 3/shared" in rows[-1]


def test_an_unfitted_part_of_the_cost_says_why_not_na(fsdp_json, buckets_json):
    from analysis.advise.comm_cost import Line, fit_cost, line_json, line_text

    # two call sizes, the larger no slower: all of the time is taken as per-byte, and the line says why
    line = line_json(fit_cost([5e6, 5e6, 7e6, 7e6], [16e6, 15e6, 15e6, 15.5e6]).overall)
    assert line["latency_us"] == 0.0 and line["bandwidth_gb_s"] == pytest.approx(74 / (5 * 15.5 + 7 * 15.25), rel=1e-3)
    assert line["latency_not_fitted"] == "2 distinct call sizes, the larger no slower"
    assert line_text(line).endswith("GB/s, no latency (not fitted: 2 distinct call sizes, the larger no slower)")
    flat = line_json(Line(1.0, 2.0, 5e6, 0.0, 10, 2))  # a line exactly flat: a latency alone
    assert flat["bandwidth_gb_s"] is None
    assert flat["bandwidth_not_fitted"] == "the calls' times did not grow with their size"
    assert line_text(flat).startswith("5000.0 us per call, whatever its size (bandwidth not fitted: the calls'")
    assert "n/a" not in render_table([buckets_json, fsdp_json])


def test_the_csv_gives_the_changes_and_the_sizes_of_one_layout_in_one_cell(buckets_json, fsdp_json):
    import csv
    import io

    from analysis.advise.command import render_csv

    rows = list(csv.DictReader(io.StringIO(render_csv([buckets_json, fsdp_json]))))
    by = {r["bucket_mb"]: r for r in rows if r["bucket_mb"]}
    assert by["100.0"]["same_layout_mb"] == "100 200" and by["0.1"]["same_layout_mb"] == "0.1"
    assert float(by["100.0"]["predicted_change_pct"]) == pytest.approx(
        buckets_json["candidates"][1]["predicted_change_pct"]
    )
    sharded = [
        r for r in rows if r["prefetch"] and float(r["prefetch"]) == 4 and r["separate_reduce_scatter"] == "False"
    ]
    assert sharded[0]["same_schedule"] == "2/True 3/False 3/True 4/False 4/True"
