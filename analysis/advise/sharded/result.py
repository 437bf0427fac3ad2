"""What `analysis.advise` answers for one sharded run: each candidate setting's predictions with their
uncertainty, the recommendation (uncertainty.choose), the JSON (the bucket layout's shape: `candidates[]`
with a `setting`, `_err` keys as 95 % half-widths, `recommended`) and the run's lines of the table."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from analysis.advise.candidate_table import candidate_frame, plus_minus
from analysis.advise.comm_cost import line_json
from analysis.advise.sharded.recorded import ShardRecorded
from analysis.advise.sharded.replay import Setting
from analysis.advise.uncertainty import Choice
from analysis.render.table import format_table

KNOB = "prefetch, separate_reduce_scatter"
COLUMNS = {
    "prefetch": "prefetch",
    "rs": "reduce-scatters",
    "step": "predicted step ms",
    "forward": "forward wait ms",
    "backward": "backward wait ms",
    "worst": "worst unit (wait ms)",
    "note": "note",
}
RUN_KEYS = ["implementation", "trace", "measured_step_ms", "replayed_step_ms", "ideal_step_ms"]


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


def label(s: Setting) -> str:
    """'prefetch 2, shared' / 'prefetch 3, separate reduce-scatters'."""
    return f"prefetch {s.prefetch}, {'separate reduce-scatters' if s.separate else 'shared'}"


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
    choice: Choice | None = None  # its settings are Setting

    def to_json(self) -> dict:
        r = self.rec
        c = self.choice
        # the recorded setting is always a candidate: there is a gain over it
        assert c is not None and c.gain_ms is not None and c.gain_ms_err is not None
        return {
            "implementation": r.implementation,
            "trace": self.trace,
            "knob": KNOB,
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
            "comm_cost": {op: line_json(k.overall) for op, k in self.costs.items()},
            "candidates": [k.to_json(r.setting) for k in self.candidates],
            "recommended": {
                "setting": {"prefetch": c.setting.prefetch, "separate_reduce_scatter": c.setting.separate},
                "best_setting": {"prefetch": c.best.prefetch, "separate_reduce_scatter": c.best.separate},
                "kept": c.kept,
                "gain_ms": round(c.gain_ms, 3),
                "gain_ms_err": round(c.gain_ms_err, 3),
                "reason": c.reason(label, "setting"),
            },
        }


def _communicator(separate: bool) -> str:
    return "separate" if separate else "shared"


def _worst(c: dict) -> str:
    w = c["worst_unit"]
    return f"{w['phase']} {w['unit']} ({w['wait_ms']:.3f})" if w["wait_ms"] > 0 else "-"


CELLS: dict[str, Callable[[dict], object]] = {
    "prefetch": lambda c: c["prefetch"],
    "rs": lambda c: _communicator(c["separate_reduce_scatter"]),
    "step": lambda c: plus_minus(c, "predicted_step_ms"),
    "forward": lambda c: plus_minus(c, "predicted_forward_wait_ms"),
    "backward": lambda c: plus_minus(c, "predicted_backward_wait_ms"),
    "worst": _worst,
}


def table_lines(run: dict) -> list[str]:
    """The lines for one sharded run."""
    rec = run["recorded_setting"]
    bandwidth = lambda c: "n/a" if c["bandwidth_gb_s"] is None else format(c["bandwidth_gb_s"], ".3f")
    cost = "; ".join(
        f"{op} {c['latency_us']:.1f} us + {bandwidth(c)} GB/s ({c['calls']} calls)"
        for op, c in run["comm_cost"].items()
    )
    chosen = run["recommended"]["setting"]
    lanes = "one stream per communicator" if run["lanes"] == 1 else f"{run['lanes']} collectives at once per group"
    return [
        f"{run['trace']}: {run['implementation']}, {run['units']} units, prefetch {rec['prefetch']}, "
        f"reduce-scatters {_communicator(rec['separate_reduce_scatter'])} ({run['recorded_setting_source']}), "
        f"{run['steps']} rank-steps",
        f"  measured step {run['measured_step_ms']:.3f} ms, of which waiting for weights and the tail "
        f"{run['measured_wait_ms']:.3f} ms; the replay at the recorded setting: {run['replayed_step_ms']:.3f} ± "
        f"{run['replayed_step_ms_err']:.3f} ms",
        f"  perfect overlap (every collective free): {run['ideal_step_ms']:.3f} ms",
        f"  model: {run['model']}, {lanes}; collective cost (all calls) {cost}; compute slowdown "
        f"{run['compute_slowdown']:.3f} ± {run['compute_slowdown_err']:.3f} ms per ms of communication beside it",
        f"  ±: {run['uncertainty']}; waits: ms per rank-step, summed over units",
        format_table(candidate_frame(run, CELLS), COLUMNS),
        f"recommended: prefetch {chosen['prefetch']}, reduce-scatters "
        f"{_communicator(chosen['separate_reduce_scatter'])} ({run['recommended']['reason']})",
        "",
    ]
