"""What `analysis.advise` answers for one sharded run: each candidate setting's predictions with their
uncertainty, the recommendation (uncertainty.choose), the JSON (the bucket layout's shape: `candidates[]`
with a `setting`, `_err` keys as 95 % half-widths, `recommended`) and the run's lines of the table."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from analysis.advise import candidate_table as table
from analysis.advise.comm_cost import line_json, line_text
from analysis.advise.sharded.recorded import GLOO_SCATTER_PHASES, ShardRecorded
from analysis.advise.sharded.replay import Setting
from analysis.advise.uncertainty import Choice
from analysis.render.table import format_table
from contract import REDUCE_SCATTER

KNOB = "prefetch, separate_reduce_scatter"
TABLE_COLUMNS = {
    "prefetch": "prefetch",
    "rs": "reduce-scatters",
    **table.COLUMNS,
    "forward": "forward wait ms",
    "backward": "backward wait ms",
    "worst": "worst unit (wait ms)",
    "note": "note",
}
SCATTER_PRICED = (
    f"priced as {GLOO_SCATTER_PHASES:g} all-gathers of its bytes (gloo's reduce-scatter is an all-reduce, and its "
    "range ends at fsdp's wait for it, not at its completion)"
)
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

    def to_json(self, recorded: Setting, noise_ms: float) -> dict:
        s = self.setting
        return {
            "setting": setting_json(s),
            **setting_json(s),
            "recorded": s == recorded,
            **table.predicted_json("step_ms", self.step_ms, self.step_err),
            **table.predicted_json("forward_wait_ms", self.forward_wait_ms, self.forward_wait_err),
            **table.predicted_json("backward_wait_ms", self.backward_wait_ms, self.backward_wait_err),
            "worst_unit": {"phase": self.worst_phase, "unit": self.worst_unit, "wait_ms": round(self.worst_wait_ms, 3)},
            **table.change_json(self, noise_ms),
            "same_schedule": [setting_json(t) for t in self.same_schedule],
        }


def setting_json(s: Setting) -> dict:
    return {"prefetch": s.prefetch, "separate_reduce_scatter": s.separate}


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
    step_noise_ms: float = 0.0  # the noise of its mean step (uncertainty.step_noise_ms)

    def to_json(self) -> dict:
        r = self.rec
        c = self.choice
        assert c is not None  # the recorded setting is always a candidate
        best = setting_json(c.best)
        return {
            "implementation": r.implementation,
            "trace": self.trace,
            "knob": KNOB,
            "model": "sharded replay (GPU kernels)" if r.gpu else "sharded replay (CPU ranges)",
            "recorded_setting": setting_json(r.setting),
            "recorded_setting_source": r.setting_source,
            "units": len(r.units),
            "lanes": r.lanes,
            "gathers_block": r.gathers_block,
            "steps": int(r.step_ns.size),
            "measured_step_ms": round(self.measured_step_ms, 3),
            "measured_wait_ms": round(self.rec.exposed_ms, 3),
            "replayed_step_ms": round(self.replayed_step_ms, 3),
            "replayed_step_ms_err": round(self.replayed_step_err, 3),
            "replay_within": bool(abs(self.replayed_step_ms - self.measured_step_ms) <= self.replayed_step_err),
            "ideal_step_ms": round(self.ideal_step_ms, 3),
            "ideal_replayed_ms": round(self.ideal_replayed_ms, 3),
            "step_spread_ms": round(self.step_spread_ms, 3),
            "step_noise_ms": round(self.step_noise_ms, 3),
            "absolute_figures": table.ABSOLUTE_FIGURES,
            "compute_slowdown": round(self.slowdown, 4),
            "compute_slowdown_err": round(self.slowdown_err, 4),
            "uncertainty": table.uncertainty_text(self.replicates),
            "comm_cost": {op: {**line_json(k.overall), **self._priced(op)} for op, k in self.costs.items()},
            "candidates": [k.to_json(r.setting, self.step_noise_ms) for k in self.candidates],
            "recommended": table.choice_json(c, label, "setting", setting=setting_json(c.setting), best_setting=best),
        }

    def _priced(self, op: str) -> dict:
        """`priced_as` where the replay does not use the op's fitted line (gloo's reduce-scatters)."""
        return {"priced_as": SCATTER_PRICED} if op == REDUCE_SCATTER and self.rec.scatter_as_all_reduce else {}


def _cost_text(op: str, line: dict) -> str:
    if line.get("priced_as"):
        return f"{op} {line['priced_as']} ({line['calls']} calls; their ranges fit {line_text(line)})"
    return f"{op} {line_text(line)} ({line['calls']} calls)"


def _communicator(separate: bool) -> str:
    return "separate" if separate else "shared"


def _worst(c: dict) -> str:
    w = c["worst_unit"]
    return f"{w['phase']} {w['unit']} ({w['wait_ms']:.3f})" if w["wait_ms"] > 0 else "-"


CELLS: dict[str, Callable[[dict], object]] = {
    "prefetch": lambda c: c["prefetch"],
    "rs": lambda c: _communicator(c["separate_reduce_scatter"]),
    **table.CHANGE_CELLS,
    "forward": lambda c: table.plus_minus(c, "predicted_forward_wait_ms"),
    "backward": lambda c: table.plus_minus(c, "predicted_backward_wait_ms"),
    "worst": _worst,
}


def _same_schedule(c: dict) -> list[dict]:
    """The settings whose replay is the candidate's."""
    return c.get("same_schedule") or [c["setting"]]


def _same_note(c: dict) -> str:
    others = [s for s in _same_schedule(c) if s != c["setting"]]
    names = ", ".join(f"{s['prefetch']}/{_communicator(s['separate_reduce_scatter'])}" for s in others)
    return f"same schedule as {names} (prefetch/reduce-scatters)" if names else ""


GATHERS_BLOCK = (
    "all-gathers block compute (no marked wait: FSDP2 on CPU gathers synchronously), so each is replayed where "
    "its unit needs its weights, at any depth"
)


def table_lines(run: dict) -> list[str]:
    """The lines for one sharded run: the recorded figures, the replay's check, the bound, the model, the
    candidates (one row per distinct schedule, changes first), the choice."""
    rec = run["recorded_setting"]
    cost = "; ".join(_cost_text(op, c) for op, c in run["comm_cost"].items())
    chosen = run["recommended"]["setting"]
    lanes = "one stream per communicator" if run["lanes"] == 1 else f"{run['lanes']} collectives at once per group"
    if run.get("gathers_block"):
        lanes += f", {GATHERS_BLOCK}"
    measured, replayed = run["measured_step_ms"], run["replayed_step_ms"]
    within = run["replay_within"]
    check = table.check_text("step", replayed, run["replayed_step_ms_err"], measured, within, replayed - measured)
    if not within:
        check += ": the changes below are differences of replays, and may miss what the replay misses"
    ideal = run["ideal_step_ms"] - measured
    frame = table.candidate_frame(run, CELLS, _same_schedule, _same_note)
    return [
        f"{run['trace']}: {run['implementation']}, {run['units']} units, prefetch {rec['prefetch']}, "
        f"reduce-scatters {_communicator(rec['separate_reduce_scatter'])} ({run['recorded_setting_source']}), "
        f"{run['steps']} rank-steps",
        f"  {table.measured_step_text(run)}, of which waiting for weights and the tail "
        f"{run['measured_wait_ms']:.3f} ms; every absolute figure is under the profiler",
        f"  replay of the recorded setting: {check}",
        f"  perfect overlap (every collective free): {ideal:+.3f} ms ({100 * ideal / measured:+.1f} %) from the "
        f"recorded step, {run['ideal_step_ms']:.3f} ms (replayed: {run['ideal_replayed_ms']:.3f} ms, at most the "
        f"replay's {replayed:.3f})",
        f"  model: {run['model']}, {lanes}; collective cost (all calls) {cost}; compute slowdown "
        f"{run['compute_slowdown']:.3f} ± {run['compute_slowdown_err']:.3f} ms per ms of communication beside it",
        f"  ±: {run['uncertainty']}; changes from the recorded setting, % of the measured step; waits: ms per "
        "rank-step, summed over units",
        format_table(frame, TABLE_COLUMNS),
        f"recommended: prefetch {chosen['prefetch']}, reduce-scatters "
        f"{_communicator(chosen['separate_reduce_scatter'])} ({run['recommended']['reason']})",
        "",
    ]
