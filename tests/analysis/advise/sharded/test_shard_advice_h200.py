"""The sharded what-if on the real bf16 H200 fsdp export (2 ranks sharing one H200, 170 units, prefetch 2,
shared reduce-scatters): its recorded waits are the held times computed from the raw SQLite tables
(test_gather_held_h200.plain_held), and the replay at the recorded setting reproduces the step."""

from __future__ import annotations

import numpy as np
import pytest

from analysis import load_trace
from analysis.advise.sharded.predict import advise_shard
from analysis.advise.sharded.recorded import recorded_shard
from analysis.advise.sharded.replay import Setting
from analysis.run.loaded_run import measure_run
from tests import gpu_traces
from tests.analysis.fsdp_units.test_gather_held_h200 import NAME, plain_held

RUN_TIMER_MS = 413.9  # PROVENANCE.md
pytestmark = [
    pytest.mark.real,  # reads the whole real trace
    pytest.mark.skipif(not (gpu_traces.GPU_H200 / f"{NAME}.xz").exists(), reason="../shared/data/gpu_h200 not present"),
]


@pytest.fixture(scope="module")
def trace(gpu_h200_trace):
    return gpu_h200_trace(NAME)


@pytest.fixture(scope="module")
def recorded(trace):
    return recorded_shard(measure_run(load_trace([trace])), "fsdp")


def test_the_recorded_waits_are_the_held_times_of_the_raw_tables(trace, recorded):
    expected_ns = sum(h for h, _ in plain_held(trace).values())  # every gather of 5 steps x 2 ranks x 2 phases
    got_ns = recorded.recorded_wait["forward"].sum() + recorded.recorded_wait["backward"].sum()
    assert recorded.step_ns.shape == (5, 2) and len(recorded.units) == 170
    assert got_ns == pytest.approx(expected_ns, rel=1e-9)
    assert recorded.setting == Setting(2, False) and recorded.setting_source.startswith("inferred")


def test_the_replay_reproduces_the_recorded_step(trace, recorded):
    advice = advise_shard(recorded, str(trace), (1, 2, 3))
    assert advice.measured_step_ms == pytest.approx(RUN_TIMER_MS, rel=0.01)
    assert advice.replayed_step_ms == pytest.approx(advice.measured_step_ms, rel=0.01)
    by = {(c.setting.prefetch, c.setting.separate): c for c in advice.candidates}
    own = by[(2, False)]
    assert own.step_ms == pytest.approx(advice.measured_step_ms)  # anchored: the recorded setting is the measured
    # the replayed waits at the recorded setting are those recorded, within 5 %
    recorded_wait = lambda phase: float(np.mean(recorded.recorded_wait[phase].sum(axis=2))) / 1e6
    assert own.forward_wait_ms == pytest.approx(recorded_wait("forward"), rel=0.05)
    assert own.backward_wait_ms == pytest.approx(recorded_wait("backward"), rel=0.05)
    assert by[(1, False)].step_ms > own.step_ms and by[(3, False)].backward_wait_ms < own.backward_wait_ms / 10


def test_the_table_holds_together_on_the_h200_recording(trace, recorded):
    """Changes from the recorded setting, the bound at most the replay, one row per schedule, and the
    recorded setting kept when no change exceeds the noise of the run's mean step."""
    run = advise_shard(recorded, str(trace), (1, 2, 3, 4)).to_json()
    by = {(c["prefetch"], c["separate_reduce_scatter"]): c for c in run["candidates"]}
    own = by[(2, False)]
    for c in run["candidates"]:
        assert c["predicted_change_ms"] == pytest.approx(c["predicted_step_ms"] - own["predicted_step_ms"], abs=2e-3)
    assert run["ideal_replayed_ms"] <= run["replayed_step_ms"] and run["ideal_step_ms"] <= run["measured_step_ms"]
    assert run["replay_within"]
    # plain Python: each step's mean over its ranks, their sample standard deviation
    means = [sum(row) / len(row) / 1e6 for row in recorded.step_ns.tolist()]
    mu = sum(means) / len(means)
    spread = (sum((m - mu) ** 2 for m in means) / (len(means) - 1)) ** 0.5
    assert run["step_spread_ms"] == pytest.approx(spread, abs=1e-3)
    assert run["step_noise_ms"] == pytest.approx(1.96 * spread / len(means) ** 0.5, abs=1e-3)
    assert max(abs(c["predicted_change_ms"]) for c in run["candidates"]) < run["step_noise_ms"]
    rec = run["recommended"]
    assert (
        rec["kept"] and not rec["beyond_noise"] and rec["setting"] == {"prefetch": 2, "separate_reduce_scatter": False}
    )
    # depth 4 replays the same schedule shared or separate
    assert {(s["prefetch"], s["separate_reduce_scatter"]) for s in by[(4, False)]["same_schedule"]} == {
        (4, False),
        (4, True),
    }
