"""advise's recommendation rule (advice_result.choose): keep the recorded size unless the best
candidate's predicted gain is larger than its uncertainty (the spread of paired bootstrap replicates)."""

from __future__ import annotations

import numpy as np

from analysis.advise.advice_result import Z95, choose


def steps(estimate: list[float], spread: float, replicates: int = 400) -> np.ndarray:
    """(1 + replicates, 2) predicted steps of two sizes: the estimate, then replicates whose difference
    (column 0 - column 1) spreads by exactly `spread` (1 sd)."""
    rng = np.random.default_rng(1)
    noise = rng.normal(0.0, 1.0, replicates)
    noise = (noise - noise.mean()) / noise.std() * spread  # exactly this spread
    common = rng.normal(0.0, 5.0, replicates)  # both sizes move together: cancels in the difference
    rows = np.column_stack([estimate[0] + common + noise, estimate[1] + common])
    return np.vstack([np.array(estimate)[None, :], rows])


def test_a_gain_within_the_uncertainty_keeps_the_recorded_size():
    # 1 MiB predicted 0.1 ms faster than the recorded 25 MiB, the difference uncertain by 0.5 ms (1 sd)
    rec = choose([1.0, 25.0], steps([574.47, 574.57], 0.5), 25.0)
    assert rec is not None and rec.kept and rec.bucket_mb == 25.0 and rec.best_bucket_mb == 1.0
    assert abs(rec.gain_ms - 0.1) < 1e-9 and abs(rec.gain_ms_err - Z95 * 0.5) < 1e-9
    assert rec.reason.startswith("kept: 1 MiB would gain 0.100 ± 0.980 ms")


def test_a_gain_beyond_the_uncertainty_switches():
    rec = choose([1.0, 25.0], steps([570.0, 575.0], 0.5), 25.0)
    assert rec is not None and not rec.kept and rec.bucket_mb == 1.0
    assert rec.reason == "5.000 ± 0.980 ms faster than the recorded size, beyond the uncertainty"


def test_the_recorded_size_as_the_fastest_is_kept():
    rec = choose([1.0, 25.0], steps([575.0, 570.0], 0.5), 25.0)
    assert rec is not None and rec.kept and rec.bucket_mb == 25.0 and rec.gain_ms == 0.0


def test_without_a_recorded_size_the_fastest_is_recommended():
    rec = choose([1.0, 25.0], steps([574.9, 575.0], 0.5), None)
    assert rec is not None and rec.bucket_mb == 1.0 and rec.gain_ms is None and not rec.kept
    assert choose([], np.zeros((1, 0)), 25.0) is None
