"""What `analysis.advise` answers for one sharded run: each candidate setting's predictions with their
uncertainty, the recommendation (keep the recorded setting unless a candidate beats it by more than the
uncertainty of that gain), and the JSON shape (the DDP advice's: `candidates[]` with a `setting`, `_err`
keys as 95 % half-widths, `recommended`)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from analysis.advise.advice_result import keep_rule
from analysis.advise.sharded.shard_model import Setting
from analysis.advise.sharded.shard_recorded import ShardRecorded


@dataclass(frozen=True)
class ShardCandidate:
    setting: Setting
    step_ms: float
    step_err: float
    forward_wait_ms: float
    forward_wait_err: float
    backward_wait_ms: float
    backward_wait_err: float
    worst_unit: str
    worst_phase: str
    worst_wait_ms: float

    def to_json(self, recorded: Setting) -> dict:
        s = self.setting
        return {
            "setting": {"prefetch": s.prefetch, "separate_reduce_scatter": s.separate},
            "prefetch": s.prefetch,
            "separate_reduce_scatter": s.separate,
            "recorded": s == recorded,
            "predicted_step_ms": round(self.step_ms, 3),
            "predicted_step_ms_err": round(self.step_err, 3),
            "predicted_forward_wait_ms": round(self.forward_wait_ms, 3),
            "predicted_forward_wait_ms_err": round(self.forward_wait_err, 3),
            "predicted_backward_wait_ms": round(self.backward_wait_ms, 3),
            "predicted_backward_wait_ms_err": round(self.backward_wait_err, 3),
            "worst_unit": {"phase": self.worst_phase, "unit": self.worst_unit, "wait_ms": round(self.worst_wait_ms, 3)},
        }


@dataclass(frozen=True)
class ShardChoice:
    """The setting chosen; `kept` when the best candidate's gain over the recorded one is within its error."""

    setting: Setting
    best: Setting
    kept: bool
    gain_ms: float
    gain_ms_err: float

    @property
    def reason(self) -> str:
        gain = f"{self.gain_ms:.3f} ± {self.gain_ms_err:.3f} ms"
        if self.kept and self.best != self.setting:
            return f"kept: {label(self.best)} would gain {gain}, within the uncertainty"
        if self.kept:
            return "kept: the recorded setting is the fastest predicted"
        return f"{gain} faster than the recorded setting, beyond the uncertainty"


def label(s: Setting) -> str:
    """'prefetch 2, shared' / 'prefetch 3, separate reduce-scatters'."""
    return f"prefetch {s.prefetch}, {'separate reduce-scatters' if s.separate else 'shared'}"


def choose(settings: list[Setting], steps: np.ndarray, recorded: Setting) -> ShardChoice:
    """Keep the recorded setting unless the best one's gain exceeds Z95 x the spread of its paired
    bootstrap differences (steps: (1 + B, C), row 0 the estimate)."""
    best = int(np.argmin(steps[0]))
    kept, gain, err = keep_rule(steps, settings.index(recorded), best)
    return ShardChoice(recorded if kept else settings[best], settings[best], kept, gain, err)


@dataclass(frozen=True)
class ShardAdvice:
    """One sharded run's measured figures, bound, predictions and recommendation."""

    rec: ShardRecorded
    trace: str
    measured_step_ms: float
    replayed_step_ms: float
    replayed_step_err: float
    ideal_step_ms: float
    slowdown: float
    slowdown_err: float
    replicates: int
    costs: dict  # op -> comm_cost.CommCost fitted on every recorded step
    candidates: list[ShardCandidate] = field(default_factory=list)
    choice: ShardChoice | None = None

    def to_json(self) -> dict:
        r = self.rec
        c = self.choice
        assert c is not None
        cost = {
            op: {"latency_us": round(k.overall.latency_ns / 1e3, 3),
                 "bandwidth_gb_s": None if np.isinf(k.overall.bandwidth_gbps) else round(k.overall.bandwidth_gbps, 4),
                 "calls": k.overall.calls}
            for op, k in self.costs.items()
        }  # fmt: skip
        return {
            "implementation": r.implementation,
            "trace": self.trace,
            "knob": "prefetch, separate_reduce_scatter",
            "model": "sharded replay (GPU kernels)" if r.gpu else "sharded replay (CPU ranges)",
            "recorded_setting": {"prefetch": r.setting.prefetch, "separate_reduce_scatter": r.setting.separate},
            "recorded_setting_source": r.setting_source,
            "units": len(r.units),
            "lanes": r.lanes,
            "steps": int(r.step_ns.size),
            "measured_step_ms": round(self.measured_step_ms, 3),
            "measured_wait_ms": round(self.rec.exposed_ms, 3),
            "replayed_step_ms": round(self.replayed_step_ms, 3),
            "replayed_step_ms_err": round(self.replayed_step_err, 3),
            "ideal_step_ms": round(self.ideal_step_ms, 3),
            "compute_slowdown": round(self.slowdown, 4),
            "compute_slowdown_err": round(self.slowdown_err, 4),
            "uncertainty": f"95% interval, {self.replicates} bootstrap resamples of the recorded steps",
            "comm_cost": cost,
            "candidates": [k.to_json(r.setting) for k in self.candidates],
            "recommended": {
                "setting": {"prefetch": c.setting.prefetch, "separate_reduce_scatter": c.setting.separate},
                "best_setting": {"prefetch": c.best.prefetch, "separate_reduce_scatter": c.best.separate},
                "kept": c.kept,
                "gain_ms": round(c.gain_ms, 3),
                "gain_ms_err": round(c.gain_ms_err, 3),
                "reason": c.reason,
            },
        }
