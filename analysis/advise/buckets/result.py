"""What `analysis.advise` answers for one DDP run: each bucket size's predictions with their uncertainty, the
recommendation (uncertainty.choose), the JSON (each candidate names its `setting`, here {"bucket_mb": x},
its predictions and their `_err`, the half-width of a 95 % interval) and the run's lines of the table."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from analysis.advise.candidate_table import candidate_frame, plus_minus
from analysis.advise.comm_cost import CommCost, line_json
from analysis.advise.uncertainty import Choice
from analysis.render.table import format_table

KNOB = "bucket_mb"
TABLE_COLUMNS = {
    "bucket_mb": "bucket MiB",
    "buckets": "buckets",
    "step": "predicted step ms",
    "exposed": "predicted exposed comm ms",
    "note": "note",
}
RUN_KEYS = ["implementation", "trace", "measured_step_ms", "ideal_step_ms", "floor_step_ms", "recommended_bucket_mb"]


@dataclass(frozen=True)
class Candidate:
    bucket_mb: float
    buckets: int
    predicted_step_ms: float
    predicted_exposed_comm_ms: float
    predicted_step_ms_err: float = 0.0  # 95 % half-width (bootstrap over steps)
    predicted_exposed_comm_ms_err: float = 0.0


def size_label(mb: float) -> str:
    return f"{mb:g} MiB"


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
    recommendation: Choice | None = None  # its settings are bucket sizes (MiB)
    model: str = "replay"  # "replay" (CPU: ranges) or "stalls" (GPU: kernels)
    slowdown_err: float = 0.0
    call_wait_ms: float | None = None  # GPU: mean wait for the other ranks per call (not the step's first)
    replicates: int = 0

    @property
    def recommended_bucket_mb(self) -> float | None:
        return None if self.recommendation is None else self.recommendation.setting

    def to_json(self) -> dict:
        lines = [self.cost.overall, *self.cost.ranges]
        rec = self.recommendation
        return {
            "implementation": self.implementation,
            "trace": self.trace,
            "knob": KNOB,
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
                    **line_json(line),
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
                "setting": {"bucket_mb": rec.setting},
                "bucket_mb": rec.setting,
                "best_bucket_mb": rec.best,
                "kept": rec.kept,
                "gain_ms": None if rec.gain_ms is None else round(rec.gain_ms, 3),
                "gain_ms_err": None if rec.gain_ms_err is None else round(rec.gain_ms_err, 3),
                "reason": rec.reason(size_label, "size"),
            },
            "recommended_bucket_mb": self.recommended_bucket_mb,
        }


def table_lines(run: dict) -> list[str]:
    """The lines for one run's JSON: the recorded figures, the model's parameters, the candidates, the choice."""
    recorded = run["recorded_bucket_mb"]
    size = f"{recorded:g} MiB buckets" if recorded else "one collective per parameter"
    lines = "; ".join(
        f"{_bytes(c['min_bytes'])}-{_bytes(c['max_bytes'])}: {c['latency_us']:.1f} us + "
        f"{'n/a' if c['bandwidth_gb_s'] is None else format(c['bandwidth_gb_s'], '.3f')} GB/s"
        for c in _distinct_lines(run["comm_cost"])
    )
    wait = run["call_wait_ms"]
    model = (
        f"GPU kernels: compute loses {run['compute_slowdown']:.3f} ± {run['compute_slowdown_err']:.3f} of its "
        f"progress while the rank's collectives are in flight; each call waits {wait:.3f} ms for the other ranks"
        if run["model"] == "stalls"
        else f"compute slowdown {run['compute_slowdown']:.3f} ± {run['compute_slowdown_err']:.3f} ms per ms of "
        "communication under backward"
    )
    cells = {
        "bucket_mb": lambda c: c["bucket_mb"],
        "buckets": lambda c: c["buckets"],
        "step": lambda c: plus_minus(c, "predicted_step_ms"),
        "exposed": lambda c: plus_minus(c, "predicted_exposed_comm_ms"),
    }
    return [
        f"{run['trace']}: {run['implementation']}, {size}, {run['steps']} rank-steps",
        f"  measured step {run['measured_step_ms']:.3f} ms, exposed communication "
        f"{run['measured_exposed_comm_ms']:.3f} ms",
        f"  perfect overlap (step - exposed): {run['ideal_step_ms']:.3f} ms; floor (max of compute, "
        f"communication): {run['floor_step_ms']:.3f} ms",
        f"  model: collective cost (overall, then per message-size range) {lines}; {model}",
        f"  ±: {run['uncertainty']}",
        format_table(candidate_frame(run, cells), TABLE_COLUMNS),
        f"recommended bucket size: {run['recommended_bucket_mb']:g} MiB ({run['recommended']['reason']})",
        "",
    ]


def _distinct_lines(lines: list[dict]) -> list[dict]:
    """The overall line, then the per-range lines that are not the overall one again (one range over every size)."""
    overall = lines[0]
    same = lambda c: (c["min_bytes"], c["max_bytes"]) == (overall["min_bytes"], overall["max_bytes"])
    return [overall, *(c for c in lines[1:] if not same(c))]


def _bytes(n: float | None) -> str:
    if n is None:
        return "inf"
    for unit, scale in (("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"
