"""The sharded layout's predictions: the step and the per-unit waits at prefetch depths 1-4, each with
reduce-scatters sharing the all-gathers' communicator or on their own, from one recorded run (recorded.py ->
replay.py), with a 95 % interval, the bound of perfect overlap, and the recommended setting (the recorded
one kept unless a candidate's gain exceeds its uncertainty). docs/advise.md, "Sharded runs".

Each prediction is anchored on the measured step: predicted = measured + replay(candidate) -
replay(recorded setting), per rank-step, so what the replay does not model cancels; the replay's own
figure at the recorded setting is reported beside the measured step (`replayed_step_ms`) as its check.
Uncertainty (uncertainty.py): the model refitted (collective costs per op, compute slowdown) and replayed on
bootstrap resamples of the recorded steps, as the bucket layout does.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

import numpy as np
import pandas as pd

from analysis.advise.comm_cost import CommCost, fit_cost
from analysis.advise.sharded.recorded import GLOO_SCATTER_PHASES, ShardRecorded, recorded_shard
from analysis.advise.sharded.replay import Phase, Replay, Setting, ShardRun, replay
from analysis.advise.sharded.result import ShardAdvice, ShardCandidate
from analysis.advise.slowdown import instrumented_slope
from analysis.advise.uncertainty import (
    changes,
    choose,
    half_width,
    resampled_calls,
    resamples,
    row_means_ms,
    step_noise_ms,
    step_spread_ms,
)
from analysis.run.loaded_run import LoadedRun
from analysis.trace.frames import NS_PER_MS
from contract import ALL_GATHER, ALL_REDUCE, REDUCE_SCATTER

DEPTHS = (1, 2, 3, 4)


def _costs(rec: ShardRecorded, chosen: pd.DataFrame) -> tuple[dict, np.ndarray, np.ndarray, np.ndarray]:
    """The cost lines per op fitted on one row's calls (`chosen`), and per unit the all-gather,
    reduce-scatter and summed all-reduce costs (ns)."""
    lines: dict[str, CommCost] = {}
    out: dict[str, np.ndarray] = {}
    for op, sizes in ((ALL_GATHER, rec.gather_bytes), (REDUCE_SCATTER, rec.scatter_bytes)):
        mine = chosen[chosen["op"] == op]
        if len(mine):
            lines[op] = fit_cost(mine["bytes"], mine["transfer_ns"])
        out[op] = _unit_costs(mine, lines.get(op), sizes)
    if rec.scatter_as_all_reduce:  # its range ends at the owner's wait, not at completion: priced from the gathers
        gathers = chosen[chosen["op"] == ALL_GATHER]
        out[REDUCE_SCATTER] = GLOO_SCATTER_PHASES * _unit_costs(gathers, lines.get(ALL_GATHER), rec.scatter_bytes)
    ar = chosen[chosen["op"] == ALL_REDUCE]
    reduce = np.zeros(len(rec.units))
    if len(ar):
        lines[ALL_REDUCE] = fit_cost(ar["bytes"], ar["transfer_ns"])
        reduce = np.array([float(lines[ALL_REDUCE].predict_ns(b).sum()) if b else 0.0 for b in rec.reduce_bytes])
    return lines, out[ALL_GATHER], out[REDUCE_SCATTER], reduce


def _unit_costs(mine: pd.DataFrame, line: CommCost | None, sizes: np.ndarray) -> np.ndarray:
    """Per unit (ns): the mean of the calls of its size in `mine` where there are some (which a step's
    time adds up), else the line's cost of its size; 0 where the unit has no such collective."""
    fitted = np.zeros(len(sizes)) if line is None else line.predict_ns(sizes)
    own = mine.groupby("bytes")["transfer_ns"].mean().reindex(sizes).to_numpy(dtype=float)
    return np.where(sizes > 0, np.where(np.isnan(own), fitted, own), 0.0)


def _slowdown(rec: ShardRecorded, pick: np.ndarray) -> float:
    """slowdown.instrumented_slope over the picked steps' compute spans (own and glue, per phase and unit)."""
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
    return instrumented_slope(np.concatenate(ys), np.concatenate(xs), np.concatenate(zs), np.concatenate(keys))


def shard_run(rec: ShardRecorded, rows: np.ndarray) -> tuple[ShardRun, dict, np.ndarray]:
    """The replay's input for every (row, step) of `rows` (1 + B, S) flattened, refitted per row; the
    costs of row 0 and the slowdown per row."""
    s = rows.shape[1]
    flat = rows.ravel()
    costs = [_costs(rec, calls) for calls in resampled_calls(rec.served, rec.steps, rows)]  # one refit per row
    slowdowns = np.array([_slowdown(rec, pick) for pick in rows])
    lam = np.repeat(slowdowns, s)
    per_unit = lambda i: np.repeat(np.stack([np.asarray(c[i], dtype=float) for c in costs]), s, axis=0)
    gather, scatter, reduce = per_unit(1), per_unit(2), per_unit(3)

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
        backward_units=rec.backward_units,
        lanes=rec.lanes,
        backward_issue=None if rec.backward_issue is None else rec.backward_issue[flat],
        gathers_block=rec.gathers_block,
    )
    return run, costs[0][0], slowdowns


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
    per_row = lambda a: row_means_ms(a, n_rows)
    err = lambda a: float(half_width(a))
    at_recorded = replay(run, rec.setting)
    settings = settings_for(rec.setting, depths)
    steps, replays = [], []
    for setting in settings:  # one replay per candidate (every bootstrap row at once)
        r = replay(run, setting)
        replays.append(r)
        steps.append(per_row(measured + r.step - at_recorded.step))
    table = np.stack(steps, axis=1)
    change, change_err = changes(table, settings.index(rec.setting))
    measured_ms = float(rec.step_ns.mean() / NS_PER_MS)
    same = _same_schedule(replays, settings)
    candidates = []
    for i, (setting, r) in enumerate(zip(settings, replays, strict=True)):
        fw, bw = per_row(r.forward_wait.sum(axis=2)), per_row(r.backward_wait.sum(axis=2))
        worst_phase, worst_unit, worst = _worst(r, rec.units, s)
        candidates.append(
            ShardCandidate(setting, float(table[0, i]), err(table[:, i]), float(fw[0]), err(fw), float(bw[0]), err(bw),
                           worst_unit, worst_phase, worst, float(change[i]), float(change_err[i]),
                           100.0 * float(change[i]) / measured_ms, 100.0 * float(change_err[i]) / measured_ms,
                           same[i])
        )  # fmt: skip
    # the bound: every collective free, never above the replay of the recorded setting it bounds
    free = np.minimum(replay(_free(run), rec.setting).step, at_recorded.step)
    replayed = per_row(at_recorded.step)
    noise = step_noise_ms(rec.step_ns)
    return ShardAdvice(
        rec=rec,
        trace=trace,
        measured_step_ms=measured_ms,
        replayed_step_ms=float(replayed[0]),
        replayed_step_err=err(replayed),
        ideal_step_ms=float(per_row(measured + free - at_recorded.step)[0]),
        slowdown=float(lam[0]),
        slowdown_err=err(lam),
        replicates=n_rows - 1,
        costs=costs,
        candidates=candidates,
        choice=choose(settings, table, rec.setting, noise),
        ideal_replayed_ms=float(per_row(free)[0]),
        step_spread_ms=step_spread_ms(rec.step_ns),
        step_noise_ms=noise,
    )


def _same_schedule(replays: list[Replay], settings: list[Setting]) -> list[tuple[Setting, ...]]:
    """Per setting, every setting whose replay is the same schedule (the same steps and waits in every
    row): a depth past what the run can prefetch, or a communicator nothing else uses, changes nothing."""
    key = lambda r: (r.step.tobytes(), r.forward_wait.tobytes(), r.backward_wait.tobytes())
    keys = [key(r) for r in replays]
    return [tuple(t for t, k2 in zip(settings, keys, strict=True) if k2 == k) for k in keys]


def _free(run: ShardRun) -> ShardRun:
    """The run with every collective free: the bound of perfect overlap (compute alone)."""
    zero = np.zeros_like(run.gather_ns)
    return replace(run, gather_ns=zero, scatter_ns=zero, reduce_ns=zero)


def _worst(r: Replay, units: list[str], steps: int) -> tuple[str, str, float]:
    """(phase, unit, mean wait ms per rank-step) of the unit that waits longest, on row 0's steps."""
    rows0 = slice(0, steps)
    fw = r.forward_wait[rows0].mean(axis=(0, 1))
    bw = r.backward_wait[rows0].mean(axis=(0, 1))
    if fw.max(initial=0) >= bw.max(initial=0):
        return "forward", units[int(fw.argmax())], float(fw.max() / NS_PER_MS)
    return "backward", units[int(bw.argmax())], float(bw.max() / NS_PER_MS)


def advise_sharded(loaded: LoadedRun, impl: str, depths: Iterable[int] | None = None) -> ShardAdvice:
    """ShardAdvice for one loaded fsdp / torch_fsdp run (depths: default DEPTHS)."""
    chosen = tuple(sorted({int(d) for d in depths})) if depths else DEPTHS
    return advise_shard(recorded_shard(loaded, impl), loaded.trace.path, chosen)
