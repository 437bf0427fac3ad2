"""What `analysis.advise` answers for one run: the candidates with their uncertainty, and the
recommendation (keep the recorded setting unless a candidate beats it by more than the uncertainty).

The JSON shape is the same for any knob: each candidate names its `setting` (here {"bucket_mb": x}),
its predictions and their `_err` (half-width of a 95 % interval); `recommended` names the setting
chosen, whether the recorded one was kept, and the gain over the recorded setting with its error.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from analysis.advise.comm_cost import CommCost

Z95 = 1.96  # half-width of a 95 % interval in standard deviations (normal approximation)


@dataclass(frozen=True)
class Candidate:
    bucket_mb: float
    buckets: int
    predicted_step_ms: float
    predicted_exposed_comm_ms: float
    predicted_step_ms_err: float = 0.0  # 95 % half-width (bootstrap over steps)
    predicted_exposed_comm_ms_err: float = 0.0


@dataclass(frozen=True)
class Recommendation:
    """The size chosen; `kept` when the best candidate's gain over the recorded size is within its error."""

    bucket_mb: float
    best_bucket_mb: float
    kept: bool
    gain_ms: float | None  # recorded size's predicted step minus the best's (None: no recorded size)
    gain_ms_err: float | None

    @property
    def reason(self) -> str:
        if self.gain_ms is None:
            return "the fastest predicted; no recorded size to keep"
        gain = f"{self.gain_ms:.3f} ± {self.gain_ms_err:.3f} ms"
        if self.kept and self.best_bucket_mb != self.bucket_mb:
            return f"kept: {self.best_bucket_mb:g} MiB would gain {gain}, within the uncertainty"
        if self.kept:
            return "kept: the recorded size is the fastest predicted"
        return f"{gain} faster than the recorded size, beyond the uncertainty"


def choose(sizes: list[float], steps: np.ndarray, recorded: float | None) -> Recommendation | None:
    """The recommendation from predicted steps (1 + B, C): row 0 the estimate, rows 1.. the bootstrap
    replicates. Keep the recorded size unless the best one's gain exceeds Z95 x its replicates' spread."""
    if not sizes:
        return None
    best = int(np.argmin(steps[0]))
    if recorded is None or recorded not in sizes:
        return Recommendation(sizes[best], sizes[best], False, None, None)
    kept, gain, err = keep_rule(steps, sizes.index(recorded), best)
    return Recommendation(recorded if kept else sizes[best], sizes[best], kept, gain, err)


def keep_rule(steps: np.ndarray, own: int, best: int) -> tuple[bool, float, float]:
    """(keep the recorded candidate?, the best one's gain over it, Z95 x the spread of that gain) from
    predicted steps (1 + B, C): row 0 the estimate, rows 1.. bootstrap replicates, paired by row."""
    diff = steps[:, own] - steps[:, best]  # paired: the same replicate's steps for both candidates
    gain, err = float(diff[0]), float(Z95 * diff[1:].std()) if len(diff) > 2 else 0.0
    return best == own or gain <= err, gain, err


@dataclass(frozen=True)
class Advice:
    """One run's measured figures, bounds and predictions (see docs/advise.md)."""

    implementation: str
    trace: str
    recorded_bucket_mb: float | None
    steps: int  # rank-steps the figures average over
    measured_step_ms: float
    measured_exposed_comm_ms: float
    ideal_step_ms: float
    floor_step_ms: float
    slowdown: float
    cost: CommCost
    candidates: list[Candidate] = field(default_factory=list)
    recommendation: Recommendation | None = None
    model: str = "replay"  # "replay" (CPU: ranges) or "stalls" (GPU: kernels)
    slowdown_err: float = 0.0
    call_wait_ms: float | None = None  # GPU: mean wait for the other ranks per call (not the step's first)
    replicates: int = 0

    @property
    def recommended_bucket_mb(self) -> float | None:
        return None if self.recommendation is None else self.recommendation.bucket_mb

    def to_json(self) -> dict:
        lines = [self.cost.overall, *self.cost.ranges]
        rec = self.recommendation
        return {
            "implementation": self.implementation,
            "trace": self.trace,
            "knob": "bucket_mb",
            "model": self.model,
            "recorded_bucket_mb": self.recorded_bucket_mb,
            "steps": self.steps,
            "measured_step_ms": round(self.measured_step_ms, 3),
            "measured_exposed_comm_ms": round(self.measured_exposed_comm_ms, 3),
            "ideal_step_ms": round(self.ideal_step_ms, 3),
            "floor_step_ms": round(self.floor_step_ms, 3),
            "compute_slowdown": round(self.slowdown, 4),
            "compute_slowdown_err": round(self.slowdown_err, 4),
            "call_wait_ms": None if self.call_wait_ms is None else round(self.call_wait_ms, 4),
            "uncertainty": f"95% interval, {self.replicates} bootstrap resamples of the recorded steps",
            "comm_cost": [
                {
                    "min_bytes": line.lo_bytes,
                    "max_bytes": None if np.isinf(line.hi_bytes) else line.hi_bytes,
                    "latency_us": round(line.latency_ns / 1e3, 3),
                    "bandwidth_gb_s": None if np.isinf(line.bandwidth_gbps) else round(line.bandwidth_gbps, 4),
                    "calls": line.calls,
                }
                for line in lines
            ],
            "candidates": [
                {
                    "setting": {"bucket_mb": c.bucket_mb},
                    "bucket_mb": c.bucket_mb,
                    "buckets": c.buckets,
                    "recorded": c.bucket_mb == self.recorded_bucket_mb,
                    "predicted_step_ms": round(c.predicted_step_ms, 3),
                    "predicted_step_ms_err": round(c.predicted_step_ms_err, 3),
                    "predicted_exposed_comm_ms": round(c.predicted_exposed_comm_ms, 3),
                    "predicted_exposed_comm_ms_err": round(c.predicted_exposed_comm_ms_err, 3),
                }
                for c in self.candidates
            ],
            "recommended": None
            if rec is None
            else {
                "setting": {"bucket_mb": rec.bucket_mb},
                "bucket_mb": rec.bucket_mb,
                "best_bucket_mb": rec.best_bucket_mb,
                "kept": rec.kept,
                "gain_ms": None if rec.gain_ms is None else round(rec.gain_ms, 3),
                "gain_ms_err": None if rec.gain_ms_err is None else round(rec.gain_ms_err, 3),
                "reason": rec.reason,
            },
            "recommended_bucket_mb": self.recommended_bucket_mb,
        }
