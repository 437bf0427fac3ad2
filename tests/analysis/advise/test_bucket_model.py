"""The what-if model on runs whose answer is worked out by hand: bucket layouts, the fitted cost, the replay."""

import numpy as np
import pandas as pd
import pytest

from analysis.advise.bucket_layout import MIB, plan_buckets
from analysis.advise.bucket_model import RecordedRun, fit_slowdown, place_in_buckets, replay, serial_collectives
from analysis.advise.comm_cost import CommCost, Line, fit_cost, fit_line, serial_starts, transfer_times


def as_lists(buckets):
    return [b.tolist() for b in buckets]


def test_overlap_bucket_closes_before_the_parameter_that_would_pass_the_cap():
    sizes = [0.6 * MIB, 0.6 * MIB, 1.5 * MIB, 1.0 * MIB, 1.0 * MIB, 3 * MIB]
    # first bucket capped at 1 MiB: 0.6 alone (0.6+0.6 > 1); then 2 MiB caps
    assert as_lists(plan_buckets(sizes, 2, "before")) == [[0], [1], [2], [3, 4], [5]]


def test_torch_closes_after_the_parameter_that_reaches_the_cap():
    sizes = [0.6 * MIB, 0.6 * MIB, 1.5 * MIB, 1.0 * MIB, 1.0 * MIB, 3 * MIB]
    # DDP: 0.6+0.6 reaches the 1 MiB first cap -> closes after; 1.5+1.0 >= 2 closes; 1.0+3 >= 2 closes
    assert as_lists(plan_buckets(sizes, 2, "after")) == [[0, 1], [2, 3], [4, 5]]


def test_a_cap_under_the_first_bucket_cap_applies_to_the_first_bucket_too():
    sizes = [0.3 * MIB] * 4
    assert as_lists(plan_buckets(sizes, 0.5, "before")) == [[0], [1], [2], [3]]
    assert as_lists(plan_buckets(sizes, 0.5, "after")) == [[0, 1], [2, 3]]


def test_a_huge_cap_gives_the_first_bucket_then_one_more():
    sizes = [0.4 * MIB] * 5
    assert as_lists(plan_buckets(sizes, 100, "before")) == [[0, 1], [2, 3, 4]]


def test_bad_bucket_arguments_are_refused():
    with pytest.raises(ValueError, match="rule"):
        plan_buckets([1], 1, "sideways")
    with pytest.raises(ValueError, match="positive"):
        plan_buckets([1], 0, "before")


def test_fit_recovers_a_known_latency_and_bandwidth():
    sizes = np.repeat([1e3, 1e4, 1e5, 1e6], 3)
    ns = 20_000 + sizes * 0.5 + np.tile([-1.0, 0.0, 1.0], 4)  # 20 us, 2 GB/s, a little noise
    latency, per_byte = fit_line(sizes, ns)
    assert latency == pytest.approx(20_000, rel=1e-3)
    assert per_byte == pytest.approx(0.5, rel=1e-4)


def test_fit_is_clamped_to_non_negative_latency():
    latency, per_byte = fit_line([1e6, 2e6], [0.5e6, 1.5e6])  # a straight line would need latency < 0
    assert latency == 0.0 and per_byte == pytest.approx((0.5e12 + 3e12) / 5e12)


def test_each_message_size_range_gets_its_own_line():
    small = np.array([1e3, 2e3, 4e3, 8e3])
    large = np.array([1e6, 2e6, 4e6, 8e6])
    sizes = np.r_[small, large]
    ns = np.r_[5_000 + small * 2.0, 50_000 + large * 0.25]  # a slow small-message path, a fast large one
    cost = fit_cost(sizes, ns)
    assert len(cost.ranges) == 2
    np.testing.assert_allclose(cost.predict_ns(sizes), ns, rtol=1e-9)
    # a size between the ranges comes from the overall line
    assert cost.predict_ns([1e5])[0] == pytest.approx(cost.overall.predict_ns([1e5])[0])
    # beyond the ranges, a range's line extends from the recorded extreme it holds
    assert cost.predict_ns([1.6e7])[0] == pytest.approx(50_000 + 1.6e7 * 0.25)
    assert cost.predict_ns([500])[0] == pytest.approx(5_000 + 500 * 2.0)


def test_a_size_recorded_beyond_every_range_is_predicted_by_the_overall_line():
    # 64-256 KiB make a range; 5 MiB was recorded alone (no line of its own): the range's flat line must
    # not be stretched 20x over it, as it had been (a recorded 10.7 ms all-reduce predicted at 1.0 ms)
    sizes = np.array([65_536, 131_072, 262_144, 5_120_000, 5_120_000])
    ns = np.array([439_000, 446_000, 467_000, 10_696_000, 10_700_000])
    cost = fit_cost(sizes, ns)
    assert [(r.lo_bytes, r.hi_bytes) for r in cost.ranges] == [(65_536, 262_144)]
    assert cost.predict_ns([5_120_000])[0] == pytest.approx(cost.overall.predict_ns([5_120_000])[0])
    assert cost.predict_ns([5_120_000])[0] == pytest.approx(10_698_000, rel=0.05)


def test_serial_starts_wait_for_the_previous_call_on_the_same_rank():
    calls = pd.DataFrame(
        {"rank": [0, 0, 0, 1], "start_ns": [0, 10, 50, 5], "end_ns": [30, 40, 60, 20]}, index=[3, 1, 2, 0]
    )
    assert serial_starts(calls).tolist() == [0, 30, 50, 5]


def test_transfer_times_take_out_queueing_and_waiting_for_the_other_rank():
    # rank 0 issues both calls at 0; rank 1 arrives at 10 and 45; each collective moves for 20 ns
    calls = pd.DataFrame(
        {
            "rank": [0, 0, 1, 1],
            "op": "all_reduce",
            "step": 0,
            "bytes": [100.0, 200.0, 100.0, 200.0],
            "start_ns": [0, 0, 10, 45],
            "end_ns": [30, 65, 30, 65],
        }
    )
    out = transfer_times(calls, world=2)
    assert sorted(out["transfer_ns"].tolist()) == [20, 20, 20, 20]


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


def test_collectives_queue_behind_each_other_and_launch_in_order():
    # ready out of order: bucket 1 ready first (at 100) but launches after bucket 0 (ready at 500)
    launch = np.maximum.accumulate(np.array([[[500.0, 100.0]]]), axis=2)
    start, end = serial_collectives(launch, np.array([300.0, 300.0]))
    assert start.tolist() == [[500, 800]] and end.tolist() == [[800, 1100]]


def test_a_collective_starts_when_the_last_rank_launched_it():
    launch = np.array([[[100.0], [400.0]]])  # 1 step, 2 ranks, 1 bucket
    start, end = serial_collectives(launch, np.array([50.0]))
    assert start.tolist() == [[400]] and end.tolist() == [[450]]


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


def test_slowdown_is_the_slope_of_backward_on_comm_under_it():
    comm = np.array([0.0, 100.0, 200.0, 300.0])
    assert fit_slowdown(1000 + 0.25 * comm, comm) == pytest.approx(0.25)
    assert fit_slowdown(1000 - 0.25 * comm, comm) == 0.0  # clamped
    assert fit_slowdown([1, 2], [1, 2]) == 0.0  # too few points
