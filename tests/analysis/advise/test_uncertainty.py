"""advise's recommendation rule (uncertainty.choose), for either layout's settings: keep the recorded one
unless the best candidate's predicted gain is larger than its uncertainty (the spread of paired bootstrap
replicates); and the resamples it is computed from."""

from __future__ import annotations

import numpy as np
import pytest

from analysis.advise.buckets.result import size_label
from analysis.advise.sharded.replay import Setting
from analysis.advise.sharded.result import label
from analysis.advise.uncertainty import Z95, changes, choose, resamples, step_noise_ms, step_spread_ms


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
    assert rec is not None and rec.kept and rec.setting == 25.0 and rec.best == 1.0
    assert abs(rec.gain_ms - 0.1) < 1e-9 and abs(rec.gain_ms_err - Z95 * 0.5) < 1e-9
    assert rec.reason(size_label, "size").startswith("kept: 1 MiB would gain 0.100 ± 0.980 ms")


def test_a_gain_beyond_the_uncertainty_switches():
    rec = choose([1.0, 25.0], steps([570.0, 575.0], 0.5), 25.0)
    assert rec is not None and not rec.kept and rec.setting == 1.0
    assert rec.reason(size_label, "size") == "5.000 ± 0.980 ms faster than the recorded size, beyond the uncertainty"


def test_the_recorded_size_as_the_fastest_is_kept():
    rec = choose([1.0, 25.0], steps([575.0, 570.0], 0.5), 25.0)
    assert rec is not None and rec.kept and rec.setting == 25.0 and rec.gain_ms == 0.0


def test_without_a_recorded_size_the_fastest_is_recommended():
    rec = choose([1.0, 25.0], steps([574.9, 575.0], 0.5), None)
    assert rec is not None and rec.setting == 1.0 and rec.gain_ms is None and not rec.kept
    assert choose([], np.zeros((1, 0)), 25.0) is None


def test_a_sharded_setting_is_kept_within_the_uncertainty_and_left_beyond_it():
    settings = [Setting(1, False), Setting(2, False), Setting(3, False)]
    rng = np.random.default_rng(0)
    noise = rng.normal(0, 2.0, size=(201, 1))
    steps = np.hstack(
        [110 + noise, 100 + noise + rng.normal(0, 1.0, (201, 1)), 99.5 + noise + rng.normal(0, 1.0, (201, 1))]
    )
    steps[0] = [110, 100, 99.5]
    kept = choose(settings, steps, Setting(2, False))
    assert kept.kept and kept.setting == Setting(2, False) and kept.best == Setting(3, False)
    assert kept.reason(label, "setting").startswith("kept: prefetch 3, shared would gain 0.500 ±")
    moved = choose(settings, steps, Setting(1, False))
    assert not moved.kept and moved.setting == Setting(3, False) and moved.gain_ms == pytest.approx(10.5)


def test_resamples_start_with_every_step_in_order_and_are_fixed():
    rows = resamples(5, replicates=50)
    assert rows.shape == (51, 5) and rows[0].tolist() == [0, 1, 2, 3, 4]
    assert np.array_equal(rows, resamples(5, replicates=50)) and rows.min() >= 0 and rows.max() <= 4
    assert resamples(1).tolist() == [[0]]


def test_the_step_spread_is_the_sd_of_the_steps_rank_means():
    step_ns = np.array([[10e6, 12e6], [14e6, 14e6], [9e6, 11e6]])
    means = [11.0, 14.0, 10.0]
    mu = sum(means) / 3
    assert step_spread_ms(step_ns) == pytest.approx((sum((m - mu) ** 2 for m in means) / 2) ** 0.5)
    assert step_spread_ms(np.array([[5e6, 5e6]])) == 0.0


def test_the_step_noise_is_the_95_percent_half_width_of_the_mean_step():
    # plain Python: 1.96 x the sample sd of the steps' rank means / sqrt(the number of steps)
    step_ns = np.array([[10e6, 12e6], [14e6, 14e6], [9e6, 11e6], [12e6, 12e6]])
    means = [11.0, 14.0, 10.0, 12.0]
    mu = sum(means) / 4
    sd = (sum((m - mu) ** 2 for m in means) / 3) ** 0.5
    assert step_noise_ms(step_ns) == pytest.approx(1.96 * sd / 4**0.5)
    assert step_noise_ms(step_ns) < step_spread_ms(step_ns)  # from four steps on, narrower than one step's spread
    assert step_noise_ms(np.array([[5e6, 5e6]])) == 0.0


def test_changes_are_paired_by_replicate():
    rows = np.array([[10.0, 12.0], [11.0, 13.0], [9.0, 11.0], [10.0, 12.5]])
    change, err = changes(rows, 0)
    assert change.tolist() == [0.0, 2.0]
    d = rows[1:, 1] - rows[1:, 0]
    assert err[1] == pytest.approx(Z95 * d.std()) and err[0] == 0


def test_within_the_noise_of_the_runs_mean_step_the_recorded_setting_is_kept():
    # 1 MiB 5 ms faster, beyond the bootstrap's 0.98 ms, but the run's mean step is known to ± 8 ms: no verdict
    every = steps([570.0, 575.0], 0.5)
    rec = choose([1.0, 25.0], every, 25.0, noise_ms=8.0)
    assert rec.kept and rec.setting == 25.0 and not rec.beyond_noise
    assert rec.reason(size_label, "size") == (
        "kept: no size is predicted to differ from the recorded one beyond the noise of the run's mean step "
        "(± 8.000 ms)"
    )
    # a third, slower size differs beyond the noise, the best gain does not: kept, the gain named
    three = np.column_stack([every, every[:, 1] + 20.0])
    rec = choose([1.0, 25.0, 50.0], three, 25.0, noise_ms=8.0)
    assert rec.kept and rec.beyond_noise
    assert rec.reason(size_label, "size").startswith("kept: 1 MiB would gain 5.000 ± 0.980 ms, within the noise")
    # noise smaller than the gain: the switch stands
    assert choose([1.0, 25.0], every, 25.0, noise_ms=2.0).setting == 1.0
