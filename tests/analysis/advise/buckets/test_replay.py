"""The bucket replay on CPU ranges (buckets/replay.py) and the placing of a bucket's gradients
(buckets/recorded.place_in_buckets), on runs whose answer is worked out by hand."""

import numpy as np
import pytest

from analysis.advise.buckets.recorded import place_in_buckets
from analysis.advise.buckets.replay import RecordedRun, replay
from analysis.advise.comm_cost import CommCost, Line


def one_rank_run(ready, sizes, step_ms, b0, b1, tail_ns, under_ns=0.0, slowdown=0.0, flags=0):
    grid = lambda v: np.full((1, 1), float(v))
    return RecordedRun(
        step_ns=grid(step_ms * 1e6),
        backward_start=grid(b0),
        backward_end=grid(b1),
        tail_ns=grid(tail_ns),
        comm_under_backward_ns=grid(under_ns),
        ready=np.asarray(ready, dtype=float)[None, None, :],
        param_bytes=np.asarray(sizes, dtype=float),
        flag_bytes=flags,
        slowdown=slowdown,
    )


LINEAR = CommCost((), Line(0.0, float("inf"), 100.0, 1.0, 0))  # 100 ns + 1 ns per byte


def test_collectives_that_fit_under_backward_at_one_size_but_not_at_another():
    # Backward runs 0..1000 ns; four 100-byte gradients ready at 200, 400, 600, 800.
    run = one_rank_run([200, 400, 600, 800], [100] * 4, step_ms=0.002, b0=0, b1=1000, tail_ns=0)
    # One bucket each: collective k runs [ready, ready+200): the last ends at 1000, nothing exposed.
    each = replay(run, [np.array([0]), np.array([1]), np.array([2]), np.array([3])], LINEAR)
    assert each.comm_end[0].tolist() == [400, 600, 800, 1000]
    assert each.tail_ns[0, 0] == 0 and each.step_ns[0, 0] == pytest.approx(2000)
    # One bucket of all four: launched at 800, costs 100 + 400 -> ends at 1300: 300 ns exposed.
    whole = replay(run, [np.arange(4)], LINEAR)
    assert whole.comm_end[0].tolist() == [1300]
    assert whole.tail_ns[0, 0] == 300 and whole.step_ns[0, 0] == pytest.approx(2300)


def test_the_recorded_tail_is_replaced_by_the_predicted_one():
    # recorded: step 5000 ns with a 700 ns tail; the replay finds no tail -> 4300 ns
    run = one_rank_run([200, 400], [100, 100], step_ms=0.005, b0=0, b1=1000, tail_ns=700)
    r = replay(run, [np.array([0]), np.array([1])], LINEAR)
    assert r.tail_ns[0, 0] == 0 and r.step_ns[0, 0] == pytest.approx(4300)


def test_flags_add_bytes_to_each_collective():
    run = one_rank_run([0, 0], [100, 100], step_ms=0.001, b0=0, b1=0, tail_ns=0, flags=4)
    r = replay(run, [np.arange(2)], LINEAR)
    assert r.comm_end[0].tolist() == [100 + 208]


def test_compute_slows_while_communication_runs():
    # recorded: backward 0..1000 with 200 ns of comm under it at slowdown 0.5 -> own compute 900 ns.
    # Replay: one collective [200, 400) under backward: backward = 900 + 0.5 * 200 = 1000 again.
    run = one_rank_run([200], [100], step_ms=0.002, b0=0, b1=1000, tail_ns=0, under_ns=200, slowdown=0.5)
    r = replay(run, [np.array([0])], LINEAR)
    assert r.backward_ns[0, 0] == pytest.approx(1000)
    # a collective after backward slows nothing: backward shrinks to 900, the step by 100
    late = one_rank_run([1000], [100], step_ms=0.002, b0=0, b1=1000, tail_ns=200, under_ns=200, slowdown=0.5)
    r = replay(late, [np.array([0])], LINEAR)
    assert r.backward_ns[0, 0] == pytest.approx(900)
    assert r.tail_ns[0, 0] == pytest.approx(300)  # ends at 1200, backward now ends at 900
    assert r.step_ns[0, 0] == pytest.approx(2000 - 1000 - 200 + 900 + 300)


def test_bucket_members_are_placed_by_size_between_bucket_issues():
    # bucket 0 (params 0, 1: 100 and 300 bytes) issued at 400 after backward started at 0;
    # bucket 1 (param 2) issued at 1000
    ready = place_in_buckets(
        np.array([[[400.0, 1000.0]]]), [np.array([0, 1]), np.array([2])], [100, 300, 50], np.array([[0.0]])
    )
    assert ready[0, 0].tolist() == [100, 400, 1000]


def test_each_call_more_costs_its_host_time_in_backward_and_in_the_gradients_after_it():
    # Recorded with one bucket of all four (issued after the last gradient); the host takes 50 ns per issue.
    # Two buckets [0, 1] and [2, 3]: one issue more, before gradients 2 and 3 (they are ready 50 ns later)
    # and in backward (50 ns longer); the collectives: [0, 1] at 400 -> 700, [2, 3] at 850 -> 1150.
    from dataclasses import replace

    run = replace(
        one_rank_run([200, 400, 600, 800], [100] * 4, step_ms=0.002, b0=0, b1=1000, tail_ns=0),
        recorded_last=np.array([3]),
        host_ns=50.0,
    )
    two = replay(run, [np.array([0, 1]), np.array([2, 3])], LINEAR)
    assert two.comm_start[0].tolist() == [400, 850]
    assert two.comm_end[0].tolist() == [700, 1150]
    assert two.backward_ns[0, 0] == pytest.approx(1050)
    assert two.tail_ns[0, 0] == pytest.approx(100) and two.step_ns[0, 0] == pytest.approx(2000 + 50 + 100)
    # the recorded layout replays the recorded backward: no issue more or fewer
    assert replay(run, [np.arange(4)], LINEAR).backward_ns[0, 0] == pytest.approx(1000)
