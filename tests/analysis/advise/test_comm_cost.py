"""The collective cost (comm_cost.py): lines fitted by hand-checkable least squares, and the calls' service
times with queueing and the wait for the last rank taken out."""

import numpy as np
import pandas as pd
import pytest

from analysis.advise.comm_cost import fit_cost, fit_line, serial_starts, transfer_times


def test_fit_recovers_a_known_latency_and_bandwidth():
    sizes = np.repeat([1e3, 1e4, 1e5, 1e6], 3)
    ns = 20_000 + sizes * 0.5 + np.tile([-1.0, 0.0, 1.0], 4)  # 20 us, 2 GB/s, a little noise
    latency, per_byte, why = fit_line(sizes, ns)
    assert why is None and latency == pytest.approx(20_000, rel=1e-3)
    assert per_byte == pytest.approx(0.5, rel=1e-4)


def test_fit_is_clamped_to_non_negative_latency():
    latency, per_byte, why = fit_line([1e6, 2e6], [0.5e6, 1.5e6])  # a straight line would need latency < 0
    assert why is None and latency == 0.0 and per_byte == pytest.approx((0.5e12 + 3e12) / 5e12)


@pytest.mark.parametrize(
    ("sizes", "ns", "why"),
    [
        ([5e6, 5e6], [15e6, 16e6], "one call size only: latency and bandwidth cannot be told apart"),
        ([5e6, 7e6, 7e6], [16e6, 15e6, 15.4e6], "2 distinct call sizes, the larger no slower"),
    ],
)
def test_calls_that_cannot_tell_a_latency_apart_are_all_per_byte(sizes, ns, why):
    # a latency alone would make a candidate's smaller calls each as slow as a recorded one
    b = np.array(sizes)
    t = pd.Series(ns).groupby(b).median()  # one figure per distinct size
    latency, per_byte, got = fit_line(sizes, ns)
    assert (latency, got) == (0.0, why)
    assert per_byte == pytest.approx(float(np.dot(t.index, t) / np.dot(t.index, t.index)))
    one_mb = fit_cost(sizes, ns).predict_ns([1e6])[0]
    assert one_mb == pytest.approx(1e6 * per_byte) and one_mb < min(ns) / 4


def test_a_latency_the_calls_cannot_tell_from_zero_is_not_fitted():
    # five sizes that a line fits with a 2 ms latency, but scattered by +-5 ms: its 95 % interval reaches 0
    sizes = np.array([30e6, 40e6, 60e6, 80e6, 110e6])
    ns = 2e6 + sizes * 2.0 + np.array([5e6, -5e6, 4e6, -4e6, 1e6])
    (_, intercept), cov = np.polyfit(sizes, ns, 1, cov=True)
    assert 0 < intercept <= 1.96 * np.sqrt(cov[1, 1])  # numpy's own covariance of the fit, not comm_cost's
    latency, per_byte, why = fit_line(sizes, ns, test_latency=True)
    assert latency == 0.0 and why.endswith("ms over 5 call sizes, not told from zero")
    assert per_byte == pytest.approx(float(np.dot(sizes, ns) / np.dot(sizes, sizes)))
    assert fit_cost(sizes, ns).overall.latency_not_fitted == why
    # the same line without the scatter keeps its latency, and the plain fit (the host-time one) keeps it anyway
    assert fit_line(sizes, 2e6 + sizes * 2.0, test_latency=True)[0] == pytest.approx(2e6)
    assert fit_line(sizes, ns)[0] == pytest.approx(intercept)


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


def test_with_two_lanes_a_call_waits_for_the_one_two_places_before_it_on_its_own_communicator():
    # rank 0: three calls issued at 0 on one communicator with 2 lanes, one on a second communicator
    calls = pd.DataFrame(
        {"rank": 0, "comm": [0, 0, 0, 1], "start_ns": [0, 0, 0, 0], "end_ns": [30, 40, 70, 20]}, index=[9, 8, 7, 6]
    )
    assert serial_starts(calls, lanes=2, channel="comm").tolist() == [0, 0, 30, 0]
    assert serial_starts(calls).tolist() == [0, 30, 40, 70]  # one lane, one communicator
