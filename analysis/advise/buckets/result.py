"""What `analysis.advise` answers for one DDP run: each bucket size's predictions with their uncertainty, the
recommendation (uncertainty.choose), the JSON (each candidate names its `setting`, here {"bucket_mb": x},
its predictions and their `_err`, the half-width of a 95 % interval) and the run's lines of the table."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from analysis.advise import candidate_table as table
from analysis.advise.comm_cost import CommCost, line_json, line_text
from analysis.advise.uncertainty import Choice
from analysis.render.table import format_table

KNOB = "bucket_mb"
TABLE_COLUMNS = {
    "bucket_mb": "bucket MiB",
    "buckets": "buckets",
    **table.COLUMNS,
    "exposed": "exposed comm under profiler ms",
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
    change_ms: float = 0.0  # the step's change from the recorded layout (paired replays)
    change_ms_err: float = 0.0
    change_pct: float = 0.0  # the same, % of the measured step
    change_pct_err: float = 0.0
    same_layout_mb: tuple[float, ...] = ()  # every candidate size that gives the same buckets

    def to_json(self, recorded_mb: float | None, noise_ms: float) -> dict:
        exposed = self.predicted_exposed_comm_ms, self.predicted_exposed_comm_ms_err
        return {
            "setting": {"bucket_mb": self.bucket_mb},
            "bucket_mb": self.bucket_mb,
            "buckets": self.buckets,
            "recorded": self.bucket_mb == recorded_mb,
            **table.predicted_json("step_ms", self.predicted_step_ms, self.predicted_step_ms_err),
            **table.predicted_json("exposed_comm_ms", *exposed),
            **table.change_json(self, noise_ms),
            "same_layout_mb": list(self.same_layout_mb),
        }


@dataclass(frozen=True)
class ReplayCheck:
    """The replay of the recorded layout (ms, 95 % half-widths): the check that the model reproduces the run."""

    step_ms: float
    step_err: float
    exposed_ms: float
    exposed_err: float


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
    replayed: ReplayCheck | None = None
    step_spread_ms: float = 0.0  # the run's step-to-step spread (1 sd of the steps' lengths)
    step_noise_ms: float = 0.0  # the noise of its mean step (uncertainty.step_noise_ms)
    call_host_ms: tuple[float, ...] = ()  # per rank: host time of each call's issue (call_cost.py)
    call_host_source: str = ""  # how that was measured, or why it was not

    @property
    def recommended_bucket_mb(self) -> float | None:
        return None if self.recommendation is None else self.recommendation.setting

    def _recommended_json(self, rec: Choice) -> dict:
        named = {"setting": {"bucket_mb": rec.setting}, "bucket_mb": rec.setting, "best_bucket_mb": rec.best}
        return table.choice_json(rec, size_label, "size", **named)

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
            "call_host_ms": [round(v, 4) for v in self.call_host_ms],
            "call_host_source": self.call_host_source,
            "uncertainty": table.uncertainty_text(self.replicates),
            "absolute_figures": table.ABSOLUTE_FIGURES,
            "step_spread_ms": round(self.step_spread_ms, 3),
            "step_noise_ms": round(self.step_noise_ms, 3),
            "replay_check": None if self.replayed is None else replay_check(self),
            "comm_cost": [
                {
                    "min_bytes": line.lo_bytes,
                    "max_bytes": None if np.isinf(line.hi_bytes) else line.hi_bytes,
                    **line_json(line),
                }
                for line in lines
            ],
            "candidates": [c.to_json(self.recorded_bucket_mb, self.step_noise_ms) for c in self.candidates],
            "recommended": None if rec is None else self._recommended_json(rec),
            "recommended_bucket_mb": self.recommended_bucket_mb,
        }


def replay_check(a: Advice) -> dict:
    """The replay of the recorded layout against the measured step and exposed communication: each within
    the replay's 95 % interval or not, and by how much it is off."""
    r = a.replayed
    assert r is not None
    check = lambda got, err, measured: {
        "replayed_ms": round(got, 3),
        "replayed_ms_err": round(err, 3),
        "measured_ms": round(measured, 3),
        "off_ms": round(got - measured, 3),
        "within": bool(abs(got - measured) <= err),
    }
    return {
        "step": check(r.step_ms, r.step_err, a.measured_step_ms),
        "exposed_comm": check(r.exposed_ms, r.exposed_err, a.measured_exposed_comm_ms),
    }


def _check_text(name: str, c: dict) -> str:
    return table.check_text(name, c["replayed_ms"], c["replayed_ms_err"], c["measured_ms"], c["within"], c["off_ms"])


def _same_layout(c: dict) -> list[dict]:
    """The settings that give the candidate's buckets."""
    return [{"bucket_mb": mb} for mb in c.get("same_layout_mb") or [c["bucket_mb"]]]


def _sizes(c: dict) -> str:
    same = c["same_layout_mb"]
    return f"{same[0]:g}" if len(same) == 1 else f"{same[0]:g}-{same[-1]:g}"


def _same_note(c: dict) -> str:
    return f"{_sizes(c)} MiB: same {c['buckets']} buckets" if len(c["same_layout_mb"]) > 1 else ""


CELLS = {
    "bucket_mb": _sizes,
    "buckets": lambda c: c["buckets"],
    **table.CHANGE_CELLS,
    "exposed": lambda c: table.plus_minus(c, "predicted_exposed_comm_ms"),
}


def table_lines(run: dict) -> list[str]:
    """The lines for one run's JSON: the recorded figures, the replay's check, the model's parameters, the
    candidates (one row per distinct layout, changes first), the choice."""
    recorded = run["recorded_bucket_mb"]
    size = f"{recorded:g} MiB buckets" if recorded else "one collective per parameter"
    lines = "; ".join(
        f"{_bytes(c['min_bytes'])}-{_bytes(c['max_bytes'])}: {line_text(c)}" for c in _distinct_lines(run["comm_cost"])
    )
    wait = run["call_wait_ms"]
    model = (
        f"GPU kernels: compute loses {run['compute_slowdown']:.3f} ± {run['compute_slowdown_err']:.3f} of its "
        f"progress while the rank's collectives are in flight; each call waits {wait:.3f} ms for the other ranks"
        if run["model"] == "stalls"
        else f"compute slowdown {run['compute_slowdown']:.3f} ± {run['compute_slowdown_err']:.3f} ms per ms of "
        "communication under backward"
    )
    host = run.get("call_host_ms") or []
    model += (
        f"; each call's issue takes {', '.join(f'{v:.3f}' for v in host)} ms of host time per rank "
        f"({run['call_host_source']})"
        if any(host)
        else f"; host time per call's issue {run.get('call_host_source') or 'not measured'}"
    )
    frame = table.candidate_frame(run, CELLS, _same_layout, _same_note)
    measured = run["measured_step_ms"]
    bound = lambda ms: f"{ms:.3f} ms ({ms - measured:+.3f} ms, {100 * (ms - measured) / measured:+.1f} %)"
    out = [
        f"{run['trace']}: {run['implementation']}, {size}, {run['steps']} rank-steps",
        f"  {table.measured_step_text(run)}, exposed communication {run['measured_exposed_comm_ms']:.3f} ms; "
        "every absolute figure is under the profiler",
    ]
    check = run.get("replay_check")
    if check:
        out.append(
            f"  replay of the recorded layout: {_check_text('step', check['step'])}; "
            f"{_check_text('exposed communication', check['exposed_comm'])}"
        )
        if not (check["step"]["within"] and check["exposed_comm"]["within"]):
            out.append(
                "  the changes below are differences of replays: what the replay misses above may also miss there"
            )
    return [
        *out,
        f"  perfect overlap (step - exposed): {bound(run['ideal_step_ms'])}; floor (max of compute, "
        f"communication): {bound(run['floor_step_ms'])}",
        f"  model: collective cost (overall, then per message-size range) {lines}; {model}",
        f"  ±: {run['uncertainty']}; changes from the recorded layout, % of the measured step",
        format_table(frame, TABLE_COLUMNS),
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
