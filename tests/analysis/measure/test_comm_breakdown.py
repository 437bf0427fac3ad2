"""Communication broken down by op and phase, hidden or exposed (measure/comm_breakdown.py)."""

import numpy as np
import pandas as pd

from analysis import analyze
from analysis.measure import intervals as iv
from analysis.measure.collective_calls import find_calls
from analysis.measure.comm_breakdown import op_phase_rows, phase_labels
from analysis.run.loaded_run import load_trace
from tests.support.synthetic import START_END, NsysWriter


def _points(intervals):
    return {t for s, e in intervals for t in range(s, e)}


def test_rows_match_a_brute_force_count_of_points():
    rng = np.random.default_rng(11)
    n = 400
    start = rng.integers(0, 2000, n)
    calls = pd.DataFrame(
        {
            "rank": rng.integers(0, 3, n),
            "step": rng.integers(0, 3, n),
            "op": rng.choice(["all_gather", "reduce_scatter", "all_reduce"], n),
            "phase": rng.choice(["forward", "backward", "after backward"], n),
            "bytes": rng.integers(1, 100, n).astype(float),
            "start_ns": start,
            "end_ns": start + rng.integers(0, 60, n),  # some empty calls
        }
    )
    compute = {}
    for rank in range(3):
        s = rng.integers(0, 2000, 150)
        compute[rank] = iv.union(s, s + rng.integers(1, 40, 150))
    rows = op_phase_rows(calls, compute)
    assert len(rows) == len(calls.groupby(["rank", "step", "op", "phase"]))
    for row in rows.itertuples():
        mine = calls[
            (calls["rank"] == row.rank)
            & (calls["step"] == row.step)
            & (calls["op"] == row.op)
            & (calls["phase"] == row.phase)
        ]
        comm = _points(zip(mine["start_ns"], mine["end_ns"], strict=True))
        busy = _points(zip(*compute[row.rank], strict=True))
        assert row.calls == len(mine)
        assert row.bytes == mine["bytes"].sum()
        assert round(row.comm_ms * 1e6) == len(comm)
        assert round(row.hidden_ms * 1e6) == len(comm & busy)
        assert round(row.exposed_ms * 1e6) == len(comm - busy)
        every = calls[(calls["rank"] == row.rank) & (calls["step"] == row.step)]  # all ops and phases, once
        all_comm = _points(zip(every["start_ns"], every["end_ns"], strict=True))
        assert round(row.all_comm_ms * 1e6) == len(all_comm) and round(row.all_exposed_ms * 1e6) == len(all_comm - busy)
    sums = rows.groupby(["rank", "step"])[["comm_ms", "all_comm_ms"]].agg({"comm_ms": "sum", "all_comm_ms": "first"})
    assert (sums["comm_ms"] > sums["all_comm_ms"] + 1e-9).any()  # random calls overlap: the rows are no partition
    whole = op_phase_rows(calls, compute, per_step=False)
    assert whole["step"].isna().all()
    assert whole["calls"].sum() == n
    one = whole[(whole["rank"] == 1) & (whole["op"] == "all_gather") & (whole["phase"] == "forward")].iloc[0]
    mine = calls[(calls["rank"] == 1) & (calls["op"] == "all_gather") & (calls["phase"] == "forward")]
    assert round(one.comm_ms * 1e6) == len(_points(zip(mine["start_ns"], mine["end_ns"], strict=True)))


def test_unknown_bytes_stay_unknown_and_a_rank_without_compute_is_all_exposed():
    calls = pd.DataFrame(
        {
            "rank": [0, 0],
            "step": [0, 0],
            "op": ["all_gather", "all_gather"],
            "phase": ["forward", "forward"],
            "bytes": [np.nan, np.nan],
            "start_ns": [0, 50],
            "end_ns": [100, 120],
        }
    )
    row = op_phase_rows(calls, {}).iloc[0]
    assert np.isnan(row.bytes) and row.calls == 2
    assert row.comm_ms * 1e6 == 120 and row.hidden_ms == 0 and row.exposed_ms * 1e6 == 120


def write_fsdp_shaped(path, scale: int = 1):
    """One CPU rank (pid 500), step 0 [0, 2000):
    forward [0, 600), backward [600, 1400), grad_sync [1400, 1500), optimizer [1500, 1900) on t500;
    blocking comm:all_gather:layers.0 [10, 110) and comm:all_gather:layers.1 [300, 350) in forward;
    async comm:reduce_scatter:layers.1 [700, 900) and comm:reduce_scatter:layers.0 [1000, 1450) (t501 -> t500),
    comm:all_reduce:replicated [1410, 1480) (blocking, in grad_sync: after backward);
    comm:all_gather:late [1950, 1990) after the optimizer, in the step: other.
    compute = forward+backward+optimizer minus blocking comm and grad_sync:
      [0,10) [110,300) [350,1400) [1500,1900)
    Every time is multiplied by `scale`.
    """
    w = NsysWriter(path, flavour="2022", cupti=False, shuffle=True, seed=9)
    w.process(500, threads={500: "python3", 501: "gloo"})
    w.meta_mark(500, 500, 1, implementation="fsdp_fixture", rank=0, world_size=1)
    w.nvtx(
        500,
        500,
        scale * np.array([0, 0, 600, 1400, 1500]),
        scale * np.array([2000, 600, 1400, 1500, 1900]),
        np.array(["step 0", "forward", "backward", "grad_sync", "optimizer"], dtype=object),
    )
    w.nvtx(
        500,
        500,
        scale * np.array([10, 300]),
        scale * np.array([110, 350]),
        np.array(["comm:all_gather:layers.0", "comm:all_gather:layers.1"], dtype=object),
        payload=np.array([4096, 4096]),
    )
    w.nvtx(
        500,
        501,
        scale * np.array([700, 1000]),
        scale * np.array([900, 1450]),
        np.array(["comm:reduce_scatter:layers.1", "comm:reduce_scatter:layers.0"], dtype=object),
        kind=START_END,
        end_tid=500,
        payload=np.array([4096, 4096]),
    )
    w.nvtx(
        500,
        500,
        scale * np.array([1410, 1950]),
        scale * np.array([1480, 1990]),
        np.array(["comm:all_reduce:replicated", "comm:all_gather:late"], dtype=object),
    )
    return w.close()


def test_phases_and_split_of_an_fsdp_shaped_cpu_trace(tmp_path):
    path = write_fsdp_shaped(tmp_path / "fsdp.sqlite")
    result = analyze(path)
    rows = result.by_op_phase
    total = rows[rows["step"].isna()].set_index(["op", "phase"])
    assert sorted(total.index) == [
        ("all_gather", "forward"),
        ("all_gather", "other"),
        ("all_reduce", "after backward"),
        ("reduce_scatter", "backward"),
    ]
    ag = total.loc[("all_gather", "forward")]
    assert (ag.calls, ag.bytes) == (2, 8192)
    assert ag.comm_ms * 1e6 == 150 and ag.hidden_ms == 0  # blocking: the rank waited all along
    rs = total.loc[("reduce_scatter", "backward")]
    # [700,900) and [1000,1450) under compute [350,1400): hidden 200 + 400, exposed [1400,1450)
    assert (rs.comm_ms * 1e6, rs.hidden_ms * 1e6, rs.exposed_ms * 1e6) == (650, 600, 50)
    assert total.loc[("all_reduce", "after backward")].exposed_ms * 1e6 == 70
    per_step = rows[rows["step"] == 0]
    assert per_step["calls"].sum() == total["calls"].sum()
    doc = result.to_json()["traces"][0]["ranks"][0]
    assert {(r["op"], r["phase"]) for r in doc["total"]["by_op_phase"]} == set(total.index)
    assert len(doc["steps"][0]["by_op_phase"]) == 4
    for r in doc["total"]["by_op_phase"]:
        assert abs(r["hidden_ms"] + r["exposed_ms"] - r["comm_ms"]) < 1e-12


def test_fsdp2_markers_give_the_phase_where_the_trace_has_no_phase_ranges(tmp_path):
    """Calls issued inside FSDP2's own record_function ranges (a foreign trace: no forward/backward
    ranges of ours) take the phase the marker names; a call issued after a backward range ended and
    before the next phase range is 'after backward'."""
    w = NsysWriter(tmp_path / "foreign.sqlite", flavour="2022", cupti=False, shuffle=False)
    w.process(600)
    w.nvtx(
        600,
        600,
        np.array([0, 10, 400, 700, 820]),
        np.array([1000, 100, 500, 800, 900]),
        np.array(
            [
                "step 0",
                "FSDP::pre_forward (layers.0)",
                "FSDP::post_backward_reduce (layers.0)",
                "backward",
                "FSDP::root_post_backward_callback",
            ],
            dtype=object,
        ),
    )
    w.nvtx(
        600,
        600,
        np.array([20, 410, 810, 830]),
        np.array([30, 420, 815, 840]),
        np.array(
            ["comm:all_gather:a", "comm:reduce_scatter:a", "comm:all_reduce:b", "comm:all_reduce:c"], dtype=object
        ),
    )
    path = w.close()
    trace = load_trace(path)
    calls = find_calls(trace).frame.sort_values("issue_ns")
    assert list(phase_labels(trace, calls)) == ["forward", "backward", "after backward", "after backward"]


def _lines(calls: pd.DataFrame, compute: dict) -> list[str]:
    from types import SimpleNamespace

    from analysis.overlap.command import op_phase_lines

    rows = op_phase_rows(calls, compute).assign(path="t.sqlite", implementation="overlap")
    return op_phase_lines(SimpleNamespace(by_op_phase=rows))


def test_the_table_says_when_the_phase_rows_overlap_in_time():
    """An all-reduce issued in backward still in flight when the optimizer's starts: 10 + 10 ms of rows, 15 ms
    of communication counted once; the note says both. Calls one after the other: no note."""
    ms = 1_000_000
    calls = pd.DataFrame(
        {
            "rank": [0, 0],
            "step": [0, 0],
            "op": ["all_reduce", "all_reduce"],
            "phase": ["backward", "optimizer"],
            "bytes": [4.0, 4.0],
            "start_ns": [0, 5 * ms],
            "end_ns": [10 * ms, 15 * ms],
        }
    )
    compute = {0: iv.union(np.array([0]), np.array([2 * ms]))}
    lines = _lines(calls, compute)
    (note,) = [line for line in lines if "note:" in line]
    assert "overlap in time" in note and "add up to 20.000 (18.000) ms per step" in note
    assert "counted once to 15.000 (13.000)" in note
    apart = calls.assign(start_ns=[0, 10 * ms], end_ns=[10 * ms, 15 * ms])
    assert not [line for line in _lines(apart, compute) if "note:" in line]
