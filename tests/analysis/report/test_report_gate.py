"""The CI gate: `--fail-if` rules, the comparison's rows, warning and verdict, and the CLI on recorded runs."""

from __future__ import annotations

import json
import math

import pytest

from analysis.overlap import command as overlap
from analysis.report import command as report
from analysis.report.compare import Comparison, RunFigures
from analysis.report.gate import breached, parse_rule
from tests.support.progress import without_progress


def test_rules_read_sign_limit_and_unit():
    r = parse_rule("exposed_comm_ms:+10%")
    assert (r.metric, r.limit, r.relative, r.direction) == ("exposed_comm_ms", pytest.approx(0.1), True, 1)
    r = parse_rule("comm_ms:all_reduce:2.5")  # the metric is everything before the last colon
    assert (r.metric, r.limit, r.relative, r.direction) == ("comm_ms:all_reduce", 2.5, False, 1)
    assert parse_rule("overlap_pct:5").direction == -1  # unsigned: the metric's bad direction
    assert parse_rule("overlap_pct:+5").direction == 1


@pytest.mark.parametrize("text", ["exposed_comm_ms", "exposed_comm_ms:", ":+10%", "step_ms:ten%", "step_ms:+-1"])
def test_malformed_rules_are_refused(text):
    with pytest.raises(ValueError, match="METRIC:LIMIT"):
        parse_rule(text)


def test_a_rule_fails_only_past_its_limit_in_its_direction():
    up10 = parse_rule("step_ms:+10%")
    assert not breached(up10, 110.0, 100.0)  # exactly at the limit holds
    assert breached(up10, 110.1, 100.0)
    assert not breached(up10, 50.0, 100.0)  # faster never fails a + rule
    down5 = parse_rule("overlap_pct:-5")
    assert breached(down5, 54.0, 60.0) and not breached(down5, 56.0, 60.0)
    assert not breached(up10, math.nan, 100.0)
    assert breached(up10, 1.0, 0.0) and not breached(up10, 0.0, 0.0)  # relative to a zero baseline: any rise


def figures(model="tiny", world=2, **metrics):
    return RunFigures(("x.sqlite",), {"implementation": "overlap", "model": model, "world_size": world}, metrics)


def test_rows_deltas_and_verdict():
    new, base = figures(step_ms=120.0, exposed_comm_ms=30.0), figures(step_ms=100.0, exposed_comm_ms=20.0)
    result = Comparison(new, base, (parse_rule("exposed_comm_ms:+10%"),))
    rows = {r["metric"]: r for r in result.rows()}
    assert rows["step_ms"]["delta"] == 20.0 and rows["step_ms"]["delta_pct"] == pytest.approx(20.0)
    assert rows["exposed_comm_ms"]["failed"] and not rows["step_ms"]["failed"]
    assert result.verdict() == "verdict: REGRESSION: exposed_comm_ms +50.0% beyond +10%"
    assert result.warnings() == []
    ok = Comparison(base, new, (parse_rule("exposed_comm_ms:+10%"),))
    assert ok.verdict() == "verdict: ok: new step 16.7% faster than baseline; 1 limit(s) held"


def test_different_models_or_world_sizes_compare_with_a_warning():
    result = Comparison(figures("small", 4, step_ms=1.0), figures("tiny", 2, step_ms=1.0), ())
    assert result.warnings() == [
        "warning: the runs differ (model small vs tiny; world size 4 vs 2): deltas compare unlike runs"
    ]


def test_comm_ms_per_op_is_wall_time_calls_in_flight_together_counted_once():
    """comm_ms:<op> is the time with a call of that kind in flight, per rank and step: three all-reduces of
    10, 7 and 4 ms where the first two overlap take 12 ms of rank 0's step, not 17."""
    import pandas as pd

    from analysis.report.compare import op_wall_ms

    ms = 1_000_000
    calls = pd.DataFrame(
        {
            "op": ["all_reduce", "all_reduce", "all_reduce", "broadcast", "all_reduce"],
            "rank": [0, 0, 1, 0, 0],
            "step": [0, 0, 0, 1, 1],
            "start_ns": [0, 5 * ms, 0, 0, 100 * ms],
            "end_ns": [10 * ms, 12 * ms, 4 * ms, 1 * ms, 103 * ms],
        }
    )
    rank_steps = 4
    by_hand = {  # per (op, rank, step): the union of its calls, then the sum over rank-steps / rank_steps
        "comm_ms:all_reduce": (12 + 4 + 3) / rank_steps,
        "comm_ms:broadcast": 1 / rank_steps,
    }
    assert op_wall_ms(calls, rank_steps) == pytest.approx(by_hand)
    assert sum((calls["end_ns"] - calls["start_ns"])[calls["op"] == "all_reduce"]) / ms / rank_steps > 5  # the sum


def gate(capsys, *args: str) -> tuple[int, str, str]:
    """`python -m analysis.report ARGS` in this process: (exit code, stdout, stderr)."""
    try:
        code = report.main(list(args))
    except SystemExit as stop:  # argparse's refusals
        code = stop.code
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture(scope="module")
def recorded(nsys_recordings):
    return nsys_recordings("naive", "overlap_bucket")


@pytest.mark.nsys
def test_the_run_exposing_more_fails_a_gate_below_its_increase_and_passes_one_above(recorded, capsys):
    """Naive and overlap_bucket recorded on CPU: which exposes more communication, and by how much, is the
    recording's (on a loaded machine overlap_bucket can hide little), so the gate's limits are set from the
    two runs' own figures (analysis.overlap's): below the increase it fails, above it and the other way
    round it passes, and its rows are those figures."""
    means = {}
    for name in ("naive", "overlap_bucket"):
        assert overlap.main([str(recorded / f"{name}.sqlite"), "--format", "json"]) == 0
        means[name] = json.loads(capsys.readouterr().out)["traces"][0]["summary"]
    worse, better = sorted(means, key=lambda n: means[n]["exposed_comm_ms"], reverse=True)
    increase_pct = 100 * (means[worse]["exposed_comm_ms"] / means[better]["exposed_comm_ms"] - 1)
    assert increase_pct > 0.02, means  # two different programs: their exposed communication differs
    worse_path, better_path = str(recorded / f"{worse}.sqlite"), str(recorded / f"{better}.sqlite")

    below, above = f"exposed_comm_ms:+{increase_pct / 2:.2f}%", f"exposed_comm_ms:+{increase_pct * 2 + 1:.2f}%"
    code, out, err = gate(capsys, worse_path, "--baseline", better_path, "--fail-if", below)
    assert code == 1, err
    assert out.strip().splitlines()[-1].startswith("verdict: REGRESSION: exposed_comm_ms +")
    code, out, err = gate(capsys, worse_path, "--baseline", better_path, "--fail-if", above)
    assert code == 0, err

    code, out, err = gate(capsys, better_path, "--baseline", worse_path, "--fail-if", below, "--format", "json")
    assert code == 0, err
    doc = json.loads(out)
    rows = {r["metric"]: r for r in doc["metrics"]}
    for metric in ("step_ms", "exposed_comm_ms", "overlap_pct"):  # the deltas are the two runs' own figures
        assert rows[metric]["new"] == pytest.approx(means[better][metric], abs=1e-3)
        assert rows[metric]["baseline"] == pytest.approx(means[worse][metric], abs=1e-3)
    assert rows["exposed_comm_ms"]["delta"] < 0 and doc["failed"] == [] and doc["warnings"] == []
    assert "comm_ms:all_reduce" in rows
    for side in ("new", "baseline"):  # wall time per rank and step: within the step and the run's comm_ms
        assert rows["comm_ms:all_reduce"][side] <= rows["comm_ms"][side] + 1e-6 <= rows["step_ms"][side] + 1e-6


@pytest.mark.nsys
def test_gate_input_errors_are_one_line_exit_2(recorded, capsys):
    naive = str(recorded / "naive.sqlite")
    for args in (
        [naive, "--baseline", naive],
        [naive, "--baseline", str(recorded / "overlap_bucket.sqlite"), "--fail-if", "nonsense:+1"],
        [naive, "--fail-if", "step_ms:+1"],
        [naive, "--baseline", str(recorded / "missing.sqlite")],
    ):
        code, _, err = gate(capsys, *args)
        lines = without_progress(err).splitlines()
        assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), args
