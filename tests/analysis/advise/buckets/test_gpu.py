"""The bucket replay on GPU kernels (buckets/gpu.replay_stalls) on runs whose answer is worked out by hand.
Times in ms-like units: only ratios matter."""

from __future__ import annotations

import numpy as np

from analysis.advise.buckets.gpu import replay_stalls


def one(ready, work, calls, lam):
    """replay_stalls of one step on one rank, as plain floats (backward, tail, comm under backward)."""
    r = replay_stalls(
        np.array([[ready]], float), np.array([[work]], float), np.array([[calls]], float), np.array([lam])
    )
    return float(r.backward_ns[0, 0]), float(r.tail_ns[0, 0]), float(r.comm_under_ns[0, 0])


def test_interference_makes_small_buckets_worse():
    # four gradients ready after 10, 20, 30, 40 of backward's 40 units of work; each call in flight 1
    # unit. Compute stops while a call runs (slowdown 1): one bucket per gradient pays 3 stalls under
    # backward (10-11, 21-22, 32-33: backward ends at 43) and the last call after it (43-44)
    assert one([10, 20, 30, 40], 40, [1, 1, 1, 1], 1.0) == (43.0, 1.0, 3.0)
    # one bucket: ready at 40, its call runs after backward: 40 + 1
    assert one([40], 40, [1], 1.0) == (40.0, 1.0, 0.0)
    # without interference (slowdown 0) the three calls hide under backward: both sizes end at 41
    assert one([10, 20, 30, 40], 40, [1, 1, 1, 1], 0.0) == (40.0, 1.0, 3.0)


def test_a_tail_dominated_run_prefers_small_buckets():
    # no interference, a call lasts 1 per gradient it carries: one bucket each leaves 1 after backward,
    # one bucket of all four leaves 4
    small = one([10, 20, 30, 40], 40, [1, 1, 1, 1], 0.0)
    large = one([40], 40, [4], 0.0)
    assert sum(small[:2]) == 41.0 and sum(large[:2]) == 44.0


def test_compute_at_half_pace_under_a_call_can_finish_inside_it():
    # slowdown 0.5: the first call (10-12) lets compute do 1 unit: 11 of 11 done at 12, under the call;
    # the second bucket (ready at 10) then runs 12-14, all of it after backward
    assert one([10, 10], 11, [2, 2], 0.5) == (12.0, 2.0, 2.0)
    # a later gradient waits for the work done, not the wall time: ready at 20 of 20, first call 10-12 does
    # 1 unit, the remaining 9 run at full pace until 21, then the last call 21-23
    assert one([10, 20], 20, [2, 2], 0.5) == (21.0, 2.0, 2.0)


def test_buckets_launch_in_order_and_queue_on_one_stream():
    # bucket 1 is ready (by its gradients) before bucket 0: it launches after it; the calls queue
    # (slowdown 0): 30-35, then 35-40; backward ends at 30, the tail is 10
    assert one([30, 5], 30, [5, 5], 0.0) == (30.0, 10.0, 0.0)
