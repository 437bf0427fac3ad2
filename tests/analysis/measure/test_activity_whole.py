"""A GPU rank's whole-capture activity is its step activity with every item in window 0 (sharing the
arrays, not copied); the kept unions equal fresh ones; one-window pieces equal keyed_union's; the overlap
command's OpenRuns (needs_events=False) gives the same overlap figures as the default."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest

from analysis.measure import intervals as iv
from analysis.measure.activity import Items, rank_work
from analysis.overlap.metrics import _pieces
from analysis.run.loaded_run import load_trace
from analysis.run.run_files import find_runs
from analysis.session import OpenRuns
from analysis.trace.patterns import Patterns
from tests.analysis.timeline.test_timeline_traces import write_trace


@pytest.fixture(scope="module")
def trace_path(tmp_path_factory):
    return write_trace(tmp_path_factory.mktemp("whole") / "overlap.sqlite", "overlap", ranks=2, steps=4)


def test_whole_capture_holds_every_compute_kernel_of_the_rank_in_window_0(trace_path):
    trace = load_trace(trace_path)
    ops = trace.gpu_ops
    for work in rank_work(trace):
        mine = ops[(ops["part"] == work.part) & (ops["pid"] == work.pid) & (ops["device"] == work.device)]
        # plain selection from the frame: kernels that are not communication, in the frame's order
        want = [
            (int(s), int(e))
            for s, e, kind, comm in zip(mine["start"], mine["end"], mine["kind"], mine["is_comm"], strict=True)
            if kind == "kernel" and not comm
        ]
        whole = work.whole.compute
        assert list(zip(whole.start.tolist(), whole.end.tolist(), strict=True)) == want
        assert set(whole.window.tolist()) == {0}
        assert np.shares_memory(whole.start, work.steps.compute.start)  # the same arrays, not a copy
        assert work.whole.comm_range_windows.tolist() == [0] * len(work.steps.comm_range_windows)


def test_a_gpu_ranks_backward_is_its_compute_launched_inside_a_backward_range(trace_path):
    trace = load_trace(trace_path)
    ops, nvtx = trace.gpu_ops, trace.nvtx
    backward = re.compile(Patterns().backward)
    for work in rank_work(trace):
        ranges = [
            (int(s), int(e))
            for part, pid, text, s, e in zip(
                nvtx["part"], nvtx["pid"], nvtx["text"], nvtx["start"], nvtx["end"], strict=True
            )
            if (part, pid) == (work.part, work.pid) and backward.search(str(text))
        ]
        mine = ops[(ops["part"] == work.part) & (ops["pid"] == work.pid) & (ops["device"] == work.device)]
        want = [
            (int(s), int(e))
            for s, e, kind, comm, launch in zip(
                mine["start"], mine["end"], mine["kind"], mine["is_comm"], mine["launch_start"], strict=True
            )
            if kind == "kernel" and not comm and launch >= 0 and any(a <= launch < b for a, b in ranges)
        ]
        assert want  # the trace has backward kernels
        for act in (work.steps, work.whole):
            got = act.backward
            assert list(zip(got.start.tolist(), got.end.tolist(), strict=True)) == want
            assert isinstance(act.backward_part, np.ndarray)  # kept as a mask over compute, not a copy
        assert work.whole.backward.window.tolist() == [0] * len(want)


def test_kept_unions_equal_fresh_ones(trace_path):
    for work in rank_work(load_trace(trace_path)):
        for act in (work.whole, work.steps):
            s, e = act.compute.as_set()
            fresh = iv.union(act.compute.start, act.compute.end)
            assert s.tolist() == fresh[0].tolist() and e.tolist() == fresh[1].tolist()
            # comm alone and compute: disjoint, together the union of comm and compute (the busy time)
            alone = act.comm_alone()
            both_s, both_e = iv.intersect(*alone, s, e)
            assert np.sum(both_e - both_s) == 0
            both = iv.union(np.r_[act.compute.start, act.comm.start], np.r_[act.compute.end, act.comm.end])
            joined = iv.union(np.r_[s, alone[0]], np.r_[e, alone[1]])
            assert [x.tolist() for x in joined] == [x.tolist() for x in both]
            assert np.sum(alone[1] - alone[0]) > 0  # this trace has comm outside compute: the check means something
        assert work.whole.compute.as_set() is work.steps.compute.as_set()  # shared, computed once


def test_where_keeping_all_is_the_same_items_and_otherwise_a_selection():
    items = Items(np.array([0, 1, -1]), np.array([5, 1, 3]), np.array([9, 4, 6]))
    assert items.where(np.ones(3, bool)) is items
    kept = items.where(items.window >= 0)
    assert kept.start.tolist() == [5, 1] and kept.end.tolist() == [9, 4]


@pytest.mark.parametrize("seed", range(5))
def test_one_window_pieces_equal_keyed_union(seed):
    rng = np.random.default_rng(seed)
    s = rng.integers(0, 1000, 200)
    e = s + rng.integers(-5, 60, 200)  # some empty or reversed: dropped by both
    items = Items(np.zeros(200, np.int64), s, e)
    got, want = _pieces(items, 1), iv.keyed_union(items.window, s, e)
    assert [a.tolist() for a in got] == [a.tolist() for a in want]
    assert got[0].dtype == want[0].dtype == np.int64


def test_overlap_without_the_collectives_view_gives_the_same_figures(trace_path):
    full = OpenRuns(find_runs([trace_path]), keep_traces=False, needs_events=True)
    lean = OpenRuns(find_runs([trace_path]), keep_traces=False)
    a, b = full.overlap(), lean.overlap()
    for name in ("steps", "totals", "summary", "by_op_phase"):
        pd.testing.assert_frame_equal(getattr(a, name), getattr(b, name))
    assert full.results()[0].call_rows is not None and lean.results()[0].call_rows is None
    # asked anyway, the view is measured from the run read again: the same view
    pd.testing.assert_frame_equal(full.collectives().calls, lean.collectives().calls)
