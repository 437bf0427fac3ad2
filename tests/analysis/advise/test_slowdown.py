"""The compute slowdown estimates (slowdown.py): the backward pass's instrumented slope on its communication
(bucket replay, CPU), the instrumented slope over compute spans (sharded replay), and the lost progress of
kernels beside communication kernels (bucket replay, GPU)."""

import numpy as np
import pandas as pd
import pytest

from analysis.advise.slowdown import backward_slope, instrumented_slope, progress_slowdown, step_sums


def confounded(rng: np.random.Generator, n: int, length: float, comm: float) -> tuple[np.ndarray, ...]:
    """n spans of `length` made longer by the host's load alone (no slowdown), each with `comm` ns of
    communication starting at a random point after its start: (spans, communication beside each span,
    communication beside the median span from the same start)."""
    spans = length + rng.uniform(0, length, n)
    begin = rng.uniform(0, length, n)
    beside = np.clip(spans - begin, 0, comm)
    typical = np.clip(np.median(spans) - begin, 0, comm)
    return spans, beside, typical


def test_the_backward_slope_is_instrumented_by_the_passes_typical_window():
    """Backward = 1000 + 0.25 x the communication under it, which the typical window's moves: 0.25. A
    pass made long by the host's load, with more of the step's communication under it the longer it is:
    ~0, where a plain least-squares slope says 1.3 (what the bucket replay used)."""
    rng = np.random.default_rng(2)
    comm = rng.uniform(0, 300, 64)
    assert backward_slope(1000 + 0.25 * comm, comm, comm) == pytest.approx(0.25)
    assert backward_slope(1000 - 0.25 * comm, comm, comm) == 0.0  # clamped
    assert backward_slope([1, 2], [1, 2], [1, 2]) == 0.0  # too few points
    backward, under, typical = confounded(rng, 20000, 1000.0, 600.0)
    assert np.polyfit(under, backward, 1)[0] > 1.0
    assert backward_slope(backward, under, typical) < 0.15


def test_the_slowdown_fit_recovers_the_slope_and_ignores_spans_long_for_other_reasons():
    """Spans = 10 + 0.3 x communication beside them: the fit says 0.3. Spans made long by the host's load,
    with more communication beside them the longer they are, while the typical window's does not grow
    with them: ~0, where a plain regression on `beside` would say 1.3."""
    rng = np.random.default_rng(1)
    unit = np.repeat(np.arange(5), 40)
    typical = rng.uniform(0, 8, unit.size)
    assert instrumented_slope(10 + 0.3 * typical, typical, typical, unit) == pytest.approx(0.3)
    unit = np.repeat(np.arange(5), 4000)
    spans, beside, typical = confounded(rng, unit.size, 10.0, 6.0)
    assert np.polyfit(beside, spans, 1)[0] > 1.0
    assert instrumented_slope(spans, beside, typical, unit) < 0.15


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
    assert progress_slowdown(10, 80, 20, 100) == 0.5
    # no kernel under the collective: compute stopped (1); a kernel at full pace beside it: 0
    assert progress_slowdown(0, 80, 20, 100) == 1.0
    assert progress_slowdown(20, 80, 20, 100) == 0.0
    # no communication to compare with
    assert progress_slowdown(0, 80, 0, 100) == 0.0


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
    assert progress_slowdown(5, 15, 10, 60) == 0.0
    assert progress_slowdown(2, 15, 10, 60) == pytest.approx(1 - (2 / 10) / (15 / 50))
