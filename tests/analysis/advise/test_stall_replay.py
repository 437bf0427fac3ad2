"""The GPU what-if's replay (stall_replay.py) and its slowdown measure (interference.py) on runs whose
answer is worked out by hand. Times in ms-like units: only ratios matter."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from analysis.advise.interference import slowdown, step_sums
from analysis.advise.stall_replay import replay_stalls


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


def kernels(*rows):
    return pd.DataFrame(rows, columns=["rank", "name", "start", "end"])


def test_the_slowdown_compares_progress_with_and_without_communication():
    # backward [0, 100); the rank's collective is in flight [50, 70). Outside it, eight 10-unit `gemm`
    # kernels back to back (80 units of work in 80); under it one `gemm` that took 20 (10 units of work
    # in 20): progress at half pace, slowdown 0.5
    busy = [(0, "gemm", t, t + 10) for t in (*range(0, 50, 10), 70, 80, 90)]
    k = kernels(*busy, (0, "gemm", 50, 70))
    comm = pd.DataFrame({"rank": [0], "start": [50], "end": [70]})
    windows = pd.DataFrame({"rank": [0], "step": [3], "lo": [0], "hi": [100]})
    sums = step_sums(k, comm, windows)
    assert sums[["step", "work_in", "work_out", "comm_ns", "span_ns"]].values.tolist() == [[3, 10, 80, 20, 100]]
    assert slowdown(10, 80, 20, 100) == 0.5
    # no kernel under the collective: compute stopped (1); a kernel at full pace beside it: 0
    assert slowdown(0, 80, 20, 100) == 1.0
    assert slowdown(20, 80, 20, 100) == 0.0
    # no communication to compare with
    assert slowdown(0, 80, 0, 100) == 0.0


def test_a_kernel_half_under_communication_does_half_its_work_there():
    # `a` alone takes 10 (its work); one `a` of 20 runs [40, 60) with the collective in flight [50, 60):
    # half of its time, so half of its 10 units of work, is under communication
    k = kernels((1, "a", 0, 10), (1, "a", 40, 60), (1, "a", 90, 100))
    comm = pd.DataFrame({"rank": [1], "start": [50], "end": [60]})
    windows = pd.DataFrame({"rank": [1, 1], "step": [0, 1], "lo": [0, 40], "hi": [40, 100]})
    sums = step_sums(k, comm, windows).set_index("step")
    assert sums.loc[0, ["work_in", "work_out", "comm_ns"]].tolist() == [0, 10, 0]
    assert sums.loc[1, ["work_in", "work_out", "comm_ns", "span_ns"]].tolist() == [5, 15, 10, 60]
    # 0.5 of work per unit of time under the collective, 0.3 outside it (idle gaps): no loss, clamped at 0
    assert slowdown(5, 15, 10, 60) == 0.0
    assert slowdown(2, 15, 10, 60) == pytest.approx(1 - (2 / 10) / (15 / 50))
