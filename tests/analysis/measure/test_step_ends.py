"""Where a GPU step ends, and the collectives outside the steps: the last step ends at its GPU work, not
where the host noticed its last collective's completion; the closing barrier after the steps is listed
but is no training collective. Synthetic exports pin the rules, the real H200 traces prove them against
a plain-Python computation from their SQLite tables and the runs' own timers."""

import json

import pytest

from analysis import analyze
from analysis.collectives.collectives_view import collectives_of
from analysis.run.loaded_run import load_trace, measure_run
from analysis.timeline.lanes import Selection, build_panel
from tests import gpu_traces
from tests.analysis.overlap.gpu_reference import read
from tests.support.synthetic_gpu import NOTICED_LATE_BARRIER, write_noticed_late

OUTSIDE = "outside steps"


def ns(ms) -> int:
    return round(float(ms) * 1e6)


@pytest.fixture(scope="module")
def noticed_late(tmp_path_factory):
    return write_noticed_late(tmp_path_factory.mktemp("late") / "late.sqlite")


def test_last_step_ends_at_its_gpu_work_not_where_the_host_noticed(noticed_late):
    steps = analyze(noticed_late).steps
    for rank in (0, 1):
        mine = steps[steps["rank"] == rank].set_index("step")
        # step 0: start to next start [0, 150); step 1: [150, 290), its kernels' end (the range ends at 295)
        assert [ns(mine.loc[k, "step_ms"]) for k in (0, 1)] == [150, 140], rank
    panel = build_panel(measure_run(load_trace(noticed_late)), Selection(step=1))
    assert panel.window_ns == (150, 290)


def test_the_closing_barrier_is_listed_apart_and_left_out_of_the_summaries(noticed_late):
    view = collectives_of([load_trace(noticed_late)])
    calls = view.calls
    outside = calls[calls["phase"] == OUTSIDE]
    assert sorted(outside["rank"]) == [0, 1] and (outside["step"] == -1).all()
    assert sorted(outside["issue_ns"]) == list(NOTICED_LATE_BARRIER)  # issue = launch (no comm range)
    # listed as it ran: rank 0 arrived at 305 and waited for rank 1's arrival at 380
    assert ns(outside.set_index("rank").loc[0, "wait_ms"]) == 75
    assert int(view.traces["outside_steps_calls"].iloc[0]) == 2
    assert view.by_rank.set_index("rank")["calls"].to_dict() == {0: 2, 1: 2}
    assert view.by_size["calls"].sum() == 4 and view.by_size["bytes"].sum() == 4 * 4096
    assert sorted(view.stragglers["step"]) == [0, 1]
    assert view.by_rank["wait_ms"].sum() == 0  # the 75 of waiting is the barrier's, not training's
    doc = view.to_json()["traces"][0]
    assert doc["outside_steps_calls"] == 2
    assert sum(c["phase"] == OUTSIDE for c in doc["calls"]) == 2
    assert {r["step"] for r in doc["stragglers"]} == {0, 1}


def test_overlap_keeps_the_barrier_out_of_the_steps_and_labels_it(noticed_late, capsys):
    from analysis.overlap.command import main

    assert main([str(noticed_late), "--format", "json"]) == 0
    trace = json.loads(capsys.readouterr().out)["traces"][0]
    for rank in trace["ranks"]:
        assert all(x["phase"] != OUTSIDE for s in rank["steps"] for x in s["by_op_phase"])
        whole = [x for x in rank["total"]["by_op_phase"] if x["phase"] == OUTSIDE]
        assert [(x["op"], x["calls"]) for x in whole] == [("all_reduce", 1)]


# --- the real H200 traces ---------------------------------------------------------------------------


def _plain_steps(path):
    """Per rank, from the SQLite tables in plain Python: each step's (start, CPU end), the end of the GPU
    work launched in the last step's CPU range, the end of the comm ranges opened in it (where the host
    noticed), and the NCCL kernels launched outside every step (start to next start; the last: its CPU range)."""
    ops, ranges, rank_of, _ = read(path)
    out = {}
    for pid, rank in rank_of.items():
        steps = sorted((r["start"], r["end"]) for r in ranges if r["pid"] == pid and r["text"].startswith("step "))
        start, cpu_end = steps[-1]
        mine = [o for o in ops if o["pid"] == pid]
        gpu_end = max(o["end"] for o in mine if start <= o["launch"][0] < cpu_end)
        comm = [r for r in ranges if r["pid"] == pid and r["text"].startswith("comm:")]
        noticed = max(r["end"] for r in comm if start <= r["start"] < cpu_end)
        bounds = [(s, steps[k + 1][0]) for k, (s, _) in enumerate(steps[:-1])] + [(start, cpu_end)]
        outside = [
            o for o in mine if o["name"].startswith("nccl") and not any(s <= o["launch"][0] < e for s, e in bounds)
        ]
        out[rank] = {"steps": steps, "gpu_end": gpu_end, "noticed": noticed, "outside": outside, "nccl": mine}
    return out


@pytest.mark.real  # reads the whole H200 traces twice (analysis and plain Python)
@pytest.mark.parametrize("name", ["fsdp_bf16.sqlite", "torch.sqlite"])
def test_h200_steps_end_at_their_gpu_work_and_agree_with_the_run_timer(gpu_h200_trace, name):
    path = gpu_h200_trace(name)
    plain = _plain_steps(path)
    steps = analyze(path).steps
    for rank, p in plain.items():
        mine = steps[steps["rank"] == rank].sort_values("step")
        start, cpu_end = p["steps"][-1]
        assert p["noticed"] > max(cpu_end, p["gpu_end"])  # the host noticed later: the trace tests the rule
        assert ns(mine["step_ms"].iloc[-1]) == max(cpu_end, p["gpu_end"]) - start
        assert mine["step_ms"].mean() == pytest.approx(gpu_traces.H200_RUN_TIMER_MS[name], rel=0.01)


@pytest.mark.real  # reads the whole H200 traces twice (analysis and plain Python)
@pytest.mark.parametrize("name", ["fsdp_bf16.sqlite", "torch.sqlite"])
def test_h200_closing_barrier_is_outside_the_training_collectives(gpu_h200_trace, name):
    path = gpu_h200_trace(name)
    plain = _plain_steps(path)
    view = collectives_of([load_trace(path)])
    calls = view.calls
    outside = calls[calls["phase"] == OUTSIDE]
    expected = sum(len(p["outside"]) for p in plain.values())
    assert int(view.traces["outside_steps_calls"].iloc[0]) == len(outside) == expected
    assert len(outside) == 2  # one barrier per rank
    by_rank = view.by_rank.set_index("rank")["calls"].to_dict()
    for rank, p in plain.items():
        kernels = [o for o in p["nccl"] if o["name"].startswith("nccl")]
        assert by_rank[rank] == len(kernels) - len(p["outside"])
        assert sorted(outside.loc[outside["rank"] == rank, "start_ns"]) == sorted(o["start"] for o in p["outside"])
    assert sorted(view.stragglers["step"]) == [2, 3, 4, 5, 6]
    assert view.by_size["calls"].sum() == len(calls) - len(outside)
