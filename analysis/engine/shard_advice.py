"""`analysis.advise` for sharded runs (fsdp, torch_fsdp): the step and the per-unit waits predicted at
prefetch depths 1-4, each with reduce-scatters sharing the all-gathers' communicator or on their own,
from one recorded run (shard_recorded.py -> measures/shard_model.replay), with a 95 % interval, the
bound of perfect overlap, and the recommended setting (the recorded one kept unless a candidate's gain
exceeds its uncertainty). docs/advise.md, "Sharded runs".

Each prediction is anchored on the measured step: predicted = measured + replay(candidate) -
replay(recorded setting), per rank-step, so what the replay does not model cancels; the replay's own
figure at the recorded setting is reported beside the measured step (`replayed_step_ms`) as its check.
Uncertainty: the model refitted (collective costs per op, compute slowdown) and replayed on bootstrap
resamples of the recorded steps, as the DDP advice does (advice_predict.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from analysis.engine.shard_recorded import ShardRecorded, recorded_shard
from analysis.frames.patterns import Patterns
from analysis.frames.trace import NS_PER_MS, Trace
from analysis.measures.comm_cost import fit_cost
from analysis.measures.shard_model import Phase, Setting, ShardRun, fit_slowdown, replay
from contract import ALL_GATHER, ALL_REDUCE, REDUCE_SCATTER

DEPTHS = (1, 2, 3, 4)
REPLICATES = 200
SEED = 0
Z95 = 1.96


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
    own = settings.index(recorded)
    diff = steps[:, own] - steps[:, best]
    gain, err = float(diff[0]), float(Z95 * diff[1:].std()) if len(diff) > 2 else 0.0
    kept = best == own or gain <= err
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
    costs: dict  # op -> CommCost fitted on every recorded step
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


def resamples(steps: int, replicates: int = REPLICATES, seed: int = SEED) -> np.ndarray:
    """(1 + replicates, steps): every step in order, then resamples with replacement (one row if 1 step)."""
    if steps < 2:
        return np.zeros((1, steps), dtype=np.int64)
    draws = np.random.default_rng(seed).integers(0, steps, size=(replicates, steps))
    return np.vstack([np.arange(steps)[None, :], draws])


def _costs(rec: ShardRecorded, pick: np.ndarray) -> tuple[dict, np.ndarray, np.ndarray, np.ndarray]:
    """The cost lines per op fitted on the picked steps, and per unit the all-gather, reduce-scatter and
    summed all-reduce costs (ns)."""
    served = rec.served
    steps = rec.steps[pick]
    chosen = pd.concat([served[served["step"] == s] for s in steps], ignore_index=True)
    lines, out = {}, {}
    for op, sizes in ((ALL_GATHER, rec.gather_bytes), (REDUCE_SCATTER, rec.scatter_bytes)):
        mine = chosen[chosen["op"] == op]
        lines[op] = fit_cost(mine["bytes"], mine["transfer_ns"]) if len(mine) else None
        line = lines[op].predict_ns(sizes) if lines[op] is not None else np.zeros(len(sizes))
        # each unit's own calls (its size) where it has some: the mean, which a step's time adds up
        own = mine.groupby("bytes")["transfer_ns"].mean().reindex(sizes).to_numpy(dtype=float)
        out[op] = np.where(sizes > 0, np.where(np.isnan(own), line, own), 0.0)
    ar = chosen[chosen["op"] == ALL_REDUCE]
    reduce = np.zeros(len(rec.units))
    if len(ar):
        lines[ALL_REDUCE] = fit_cost(ar["bytes"], ar["transfer_ns"])
        reduce = np.array([float(lines[ALL_REDUCE].predict_ns(b).sum()) if b else 0.0 for b in rec.reduce_bytes])
    return {k: v for k, v in lines.items() if v is not None}, out[ALL_GATHER], out[REDUCE_SCATTER], reduce


def _slowdown(rec: ShardRecorded, pick: np.ndarray) -> float:
    """fit_slowdown over the picked steps' compute spans (own and glue, per phase and unit)."""
    ys, xs, zs, keys = [], [], [], []
    for p, phase in enumerate(("forward", "backward")):
        sp = rec.spans[phase]
        for kind, name in ((0, "own"), (1, "glue")):
            y = sp[name][pick]
            k = np.broadcast_to(np.arange(y.shape[2]) * 4 + p * 2 + kind, y.shape)
            ys.append(y.ravel())
            xs.append(sp[f"{name}_beside"][pick].ravel())
            zs.append(sp[f"{name}_typical"][pick].ravel())
            keys.append(k.ravel())
    return fit_slowdown(*(np.concatenate(a) for a in (ys, xs, zs, keys)))


def shard_run(rec: ShardRecorded, rows: np.ndarray) -> tuple[ShardRun, dict, np.ndarray]:
    """The replay's input for every (row, step) of `rows` (1 + B, S) flattened, refitted per row; the
    costs of row 0 and the slowdown per row."""
    n_rows, s = rows.shape
    flat = rows.ravel()
    fitted = [(_costs(rec, pick), _slowdown(rec, pick)) for pick in rows]  # one refit per replicate
    lam = np.repeat([f[1] for f in fitted], s)
    per = lambda i: np.repeat(np.stack([f[0][i] for f in fitted]), s, axis=0)
    gather, scatter, reduce = per(1), per(2), per(3)

    def phase(name: str) -> Phase:
        sp = rec.spans[name]
        base = lambda key: np.maximum(sp[key][flat] - lam[:, None, None] * sp[f"{key}_beside"][flat], 0.0)
        lead = np.maximum(sp["lead"][flat] - lam[:, None] * sp["lead_beside"][flat], 0.0)
        return Phase(lead=lead, own=base("own"), glue=base("glue"))

    run = ShardRun(
        forward=phase("forward"),
        backward=phase("backward"),
        gap=rec.gap[flat],
        other=rec.other[flat],
        gather_ns=gather,
        scatter_ns=scatter,
        reduce_ns=reduce,
        slowdown=lam,
        offset=rec.offset[flat],
        lanes=rec.lanes,
    )
    return run, fitted[0][0][0], np.array([f[1] for f in fitted])


def settings_for(recorded: Setting, depths: tuple[int, ...] = DEPTHS) -> list[Setting]:
    """Every depth x {shared, separate}, plus the recorded setting."""
    every = [Setting(d, sep) for d in sorted({*depths, recorded.prefetch}) for sep in (False, True)]
    return every


def advise_shard(rec: ShardRecorded, trace: str, depths: tuple[int, ...] = DEPTHS) -> ShardAdvice:
    """Predictions and the recommendation for one recorded sharded run."""
    rows = resamples(len(rec.steps))
    n_rows, s = rows.shape
    run, costs, lam = shard_run(rec, rows)
    measured = rec.step_ns[rows.ravel()]
    per_row = lambda a: a.reshape(n_rows, -1).mean(axis=1) / NS_PER_MS
    err = lambda a: float(Z95 * a[1:].std()) if len(a) > 2 else 0.0
    at_recorded = replay(run, rec.setting)
    settings = settings_for(rec.setting, depths)
    steps, candidates = [], []
    for setting in settings:  # one replay per candidate (every bootstrap row at once)
        r = replay(run, setting)
        step = per_row(measured + r.step - at_recorded.step)
        fw, bw = per_row(r.forward_wait.sum(axis=2)), per_row(r.backward_wait.sum(axis=2))
        steps.append(step)
        worst_phase, worst_unit, worst = _worst(r, rec.units, s)
        candidates.append(
            ShardCandidate(setting, float(step[0]), err(step), float(fw[0]), err(fw), float(bw[0]), err(bw),
                           worst_unit, worst_phase, worst)
        )  # fmt: skip
    ideal = replay(_free(run), rec.setting)
    replayed = per_row(at_recorded.step)
    return ShardAdvice(
        rec=rec,
        trace=trace,
        measured_step_ms=float(rec.step_ns.mean() / NS_PER_MS),
        replayed_step_ms=float(replayed[0]),
        replayed_step_err=err(replayed),
        ideal_step_ms=float(per_row(ideal.step)[0]),
        slowdown=float(lam[0]),
        slowdown_err=err(lam),
        replicates=n_rows - 1,
        costs=costs,
        candidates=candidates,
        choice=choose(settings, np.stack(steps, axis=1), rec.setting),
    )


def _free(run: ShardRun) -> ShardRun:
    """The run with every collective free: the bound of perfect overlap (compute alone)."""
    from dataclasses import replace

    zero = np.zeros_like(run.gather_ns)
    return replace(run, gather_ns=zero, scatter_ns=zero, reduce_ns=zero)


def _worst(r, units: list[str], steps: int) -> tuple[str, str, float]:
    """(phase, unit, mean wait ms per rank-step) of the unit that waits longest, on row 0's steps."""
    rows0 = slice(0, steps)
    fw = r.forward_wait[rows0].mean(axis=(0, 1))
    bw = r.backward_wait[rows0].mean(axis=(0, 1))
    if fw.max(initial=0) >= bw.max(initial=0):
        return "forward", units[int(fw.argmax())], float(fw.max() / NS_PER_MS)
    return "backward", units[int(bw.argmax())], float(bw.max() / NS_PER_MS)


def advise_sharded(
    trace: Trace, impl: str, depths: Iterable[int] | None = None, patterns: Patterns | None = None
) -> ShardAdvice:
    """ShardAdvice for one loaded fsdp / torch_fsdp trace (depths: default DEPTHS)."""
    chosen = tuple(sorted({int(d) for d in depths})) if depths else DEPTHS
    return advise_shard(recorded_shard(trace, impl, patterns), trace.path, chosen)
