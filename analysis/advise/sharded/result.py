"""What `analysis.advise` answers for one sharded run: each candidate setting's predictions with their
uncertainty, the recommendation (uncertainty.choose), the JSON (the bucket layout's shape: `candidates[]`
with a `setting`, `_err` keys as 95 % half-widths, `recommended`) and the run's lines of the table."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from analysis.advise.candidate_table import candidate_frame, plus_minus
from analysis.advise.comm_cost import line_json, line_text
from analysis.advise.sharded.recorded import ShardRecorded
from analysis.advise.sharded.replay import Setting
from analysis.advise.uncertainty import Choice
from analysis.render.table import format_table

KNOB = "prefetch, separate_reduce_scatter"
COLUMNS = {
    "prefetch": "prefetch",
    "rs": "reduce-scatters",
    "change_ms": "step change ms",
    "change_pct": "step change %",
    "step": "step under profiler ms",
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
    change_ms: float = 0.0  # the step's change from the recorded setting (paired replays)
    change_ms_err: float = 0.0
    change_pct: float = 0.0  # the same, % of the measured step
    change_pct_err: float = 0.0
    same_schedule: tuple[Setting, ...] = ()  # every candidate whose replay is this one's

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
            "predicted_change_ms": round(self.change_ms, 3),
            "predicted_change_ms_err": round(self.change_ms_err, 3),
            "predicted_change_pct": round(self.change_pct, 3),
            "predicted_change_pct_err": round(self.change_pct_err, 3),
            "same_schedule": [
                {"prefetch": t.prefetch, "separate_reduce_scatter": t.separate} for t in self.same_schedule
            ],
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
    ideal_replayed_ms: float = 0.0  # the replay with every collective free (<= replayed_step_ms)
    step_spread_ms: float = 0.0  # the run's step-to-step spread (1 sd of the steps' lengths)

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
            "replay_within": bool(abs(self.replayed_step_ms - self.measured_step_ms) <= self.replayed_step_err),
            "ideal_step_ms": round(self.ideal_step_ms, 3),
            "ideal_replayed_ms": round(self.ideal_replayed_ms, 3),
            "step_spread_ms": round(self.step_spread_ms, 3),
            "absolute_figures": "under the profiler: the recorded step plus the predicted change",
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
                "beyond_noise": c.beyond_noise,
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
    "change_ms": lambda c: f"{c['predicted_change_ms']:+.3f} ± {c['predicted_change_ms_err']:.3f}",
    "change_pct": lambda c: f"{c['predicted_change_pct']:+.1f} ± {c['predicted_change_pct_err']:.1f}",
    "step": lambda c: plus_minus(c, "predicted_step_ms"),
    "forward": lambda c: plus_minus(c, "predicted_forward_wait_ms"),
    "backward": lambda c: plus_minus(c, "predicted_backward_wait_ms"),
    "worst": _worst,
}


def merged(run: dict) -> dict:
    """The run with one candidate per distinct schedule (the recorded setting standing for its own), its
    note naming the settings that replay the same."""
    out, seen = [], []
    for c in run["candidates"]:
        same = c.get("same_schedule") or [c["setting"]]
        if same in seen:
            continue
        seen.append(same)
        group = [d for d in run["candidates"] if d["setting"] in same]
        out.append(next((d for d in group if d["recorded"]), c))
    return {**run, "candidates": out}


def _same(c: dict) -> str:
    others = [s for s in c.get("same_schedule") or [] if s != c["setting"]]
    names = ", ".join(f"{s['prefetch']}/{_communicator(s['separate_reduce_scatter'])}" for s in others)
    return f"same schedule as {names} (prefetch/reduce-scatters)" if names else ""


def table_lines(run: dict) -> list[str]:
    """The lines for one sharded run: the recorded figures, the replay's check, the bound, the model, the
    candidates (one row per distinct schedule, changes first), the choice."""
    rec = run["recorded_setting"]
    cost = "; ".join(f"{op} {line_text(c)} ({c['calls']} calls)" for op, c in run["comm_cost"].items())
    chosen = run["recommended"]["setting"]
    lanes = "one stream per communicator" if run["lanes"] == 1 else f"{run['lanes']} collectives at once per group"
    measured, replayed = run["measured_step_ms"], run["replayed_step_ms"]
    off = replayed - measured
    check = (
        "within its interval"
        if run["replay_within"]
        else f"NOT within its interval (off by {off:+.3f} ms, {100 * off / measured:+.1f} %): the changes below are "
        "differences of replays, and may miss what the replay misses"
    )
    ideal = run["ideal_step_ms"] - measured
    shown = merged(run)
    frame = candidate_frame(shown, CELLS)
    frame["note"] = [
        ", ".join(x for x in (n, _same(c)) if x) for n, c in zip(frame["note"], shown["candidates"], strict=True)
    ]
    return [
        f"{run['trace']}: {run['implementation']}, {run['units']} units, prefetch {rec['prefetch']}, "
        f"reduce-scatters {_communicator(rec['separate_reduce_scatter'])} ({run['recorded_setting_source']}), "
        f"{run['steps']} rank-steps",
        f"  measured step {measured:.3f} ms (step-to-step spread {run['step_spread_ms']:.3f} ms), of which waiting "
        f"for weights and the tail {run['measured_wait_ms']:.3f} ms; every absolute figure is under the profiler",
        f"  replay of the recorded setting: step {replayed:.3f} ± {run['replayed_step_ms_err']:.3f} ms vs "
        f"{measured:.3f} measured, {check}",
        f"  perfect overlap (every collective free): {ideal:+.3f} ms ({100 * ideal / measured:+.1f} %) from the "
        f"recorded step, {run['ideal_step_ms']:.3f} ms (replayed: {run['ideal_replayed_ms']:.3f} ms, at most the "
        f"replay's {replayed:.3f})",
        f"  model: {run['model']}, {lanes}; collective cost (all calls) {cost}; compute slowdown "
        f"{run['compute_slowdown']:.3f} ± {run['compute_slowdown_err']:.3f} ms per ms of communication beside it",
        f"  ±: {run['uncertainty']}; changes from the recorded setting, % of the measured step; waits: ms per "
        "rank-step, summed over units",
        format_table(frame, COLUMNS),
        f"recommended: prefetch {chosen['prefetch']}, reduce-scatters "
        f"{_communicator(chosen['separate_reduce_scatter'])} ({run['recommended']['reason']})",
        "",
    ]
