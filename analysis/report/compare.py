"""The figures behind `python -m analysis.report NEW... --baseline OLD...`: `trace_figures` of
two runs opened by session.OpenRuns, `compare_figures` of them (the API: `open_runs(new, merge=True).compare(
baseline, rules)`).

Each side is one run: one file, or the one-rank files of one run (merged, as `--merge` does). Its
metrics are the analysis' means per step over ranks (overlap/metrics.py) plus, per collective kind,
`comm_ms:<op>`: the wall time per rank and step with at least one call of that kind in flight (calls in
flight together counted once, as in comm_ms: not the sum of the calls' durations). Runs of different models or world
sizes are compared, with a warning.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.errors import TraceError
from analysis.measure import intervals as iv
from analysis.overlap.analyze import analyze_run
from analysis.report.gate import Rule, breached, change, parse_rule, unknown_metrics
from analysis.run.loaded_run import LoadedRun
from analysis.trace.frames import NS_PER_MS

RUN_METRICS = ["step_ms", "compute_ms", "comm_ms", "exposed_comm_ms", "overlap_pct", "backward_overlap_ms", "idle_ms"]
IDENTITY = ["implementation", "model", "world_size"]


@dataclass(frozen=True)
class RunFigures:
    """One run: where it came from, what it is (implementation, model, world size) and its metrics."""

    paths: tuple[str, ...]
    about: dict
    metrics: dict[str, float]


@dataclass(frozen=True)
class Comparison:
    new: RunFigures
    baseline: RunFigures
    rules: tuple[Rule, ...]

    def rows(self) -> list[dict]:
        """One row per metric either run has: metric, baseline, new, delta, delta_pct, limit, failed."""
        by_metric = {r.metric: r for r in self.rules}
        names = [*RUN_METRICS, *sorted((set(self.new.metrics) | set(self.baseline.metrics)) - set(RUN_METRICS))]
        out = []
        for name in names:
            base, new = self.baseline.metrics.get(name, math.nan), self.new.metrics.get(name, math.nan)
            delta, rel = change(new, base)
            rule = by_metric.get(name)
            out.append(
                {
                    "metric": name,
                    "baseline": base,
                    "new": new,
                    "delta": delta,
                    "delta_pct": rel * 100,
                    "limit": rule.text.rpartition(":")[2] if rule else None,
                    "failed": bool(rule and breached(rule, new, base)),
                }
            )
        return out

    @property
    def failed(self) -> list[dict]:
        return [r for r in self.rows() if r["failed"]]

    def warnings(self) -> list[str]:
        """Why the runs may not be comparable: a different model or world size."""
        differ = [
            f"{k.replace('_', ' ')} {self.new.about.get(k)} vs {self.baseline.about.get(k)}"
            for k in ("model", "world_size")
            if self.new.about.get(k) != self.baseline.about.get(k)
        ]
        return [f"warning: the runs differ ({'; '.join(differ)}): deltas compare unlike runs"] if differ else []

    def verdict(self) -> str:
        """One line: the rules broken, or the step time's change when none is."""
        failed = self.failed
        if failed:
            broken = ", ".join(f"{r['metric']} {_signed(r)} beyond {r['limit']}" for r in failed)
            return f"verdict: REGRESSION: {broken}"
        step = next(r for r in self.rows() if r["metric"] == "step_ms")
        checked = f"; {len(self.rules)} limit(s) held" if self.rules else ""
        if math.isnan(step["delta_pct"]):
            return f"verdict: no step time to compare{checked}"
        word = "slower" if step["delta"] > 0 else "faster"
        return f"verdict: ok: new step {abs(step['delta_pct']):.1f}% {word} than baseline{checked}"

    def to_json(self) -> dict:
        return {
            "new": {"paths": list(self.new.paths), **self.new.about},
            "baseline": {"paths": list(self.baseline.paths), **self.baseline.about},
            "metrics": [{k: _plain(v) for k, v in r.items()} for r in self.rows()],
            "warnings": self.warnings(),
            "verdict": self.verdict(),
            "failed": [r["metric"] for r in self.failed],
        }


def _signed(row: dict) -> str:
    """The change as its limit is written: relative for a % limit (when the baseline is not 0), else absolute."""
    pct = row["delta_pct"]
    relative = str(row["limit"]).endswith("%") and not math.isnan(pct)
    return f"{pct:+.1f}%" if relative else f"{row['delta']:+.3f}"


def _plain(value: object) -> object:
    if isinstance(value, float) and math.isnan(value):
        return None
    return round(value, 4) if isinstance(value, float) else value


def trace_figures(run: LoadedRun, paths: Iterable[str | Path]) -> RunFigures:
    """The metrics of a run already loaded from `paths` (its whole capture: no step, rank or skip), from
    what its load measured (its activity and collective calls)."""
    analysis = analyze_run(run)
    summary = analysis.summary.iloc[0].to_dict()
    metrics = {k: float(summary[k]) for k in RUN_METRICS if k in summary}
    calls = run.calls.frame
    metrics.update(op_wall_ms(calls[calls["step"] >= 0], max(len(analysis.steps), 1)))
    about = {k: _plain_id(summary.get(k)) for k in IDENTITY}
    return RunFigures(tuple(str(p) for p in paths), about, metrics)


def op_wall_ms(calls: pd.DataFrame, rank_steps: int) -> dict[str, float]:
    """`comm_ms:<op>` per collective kind: the wall time of each rank's step during which at least one
    call of that kind was in flight (calls in flight together counted once, as comm_ms counts them:
    bucketed all-reduces overlap each other, so their summed durations exceed the step), summed over
    rank-steps and divided by `rank_steps`: ms per rank and step, never more than step_ms."""
    if calls.empty:
        return {}
    key = calls.groupby(["op", "rank", "step"], sort=False, observed=True).ngroup().to_numpy()
    op_of_key = pd.Series(calls["op"].astype(str).to_numpy()).groupby(key).first()
    pieces, starts, ends = iv.keyed_union(key, calls["start_ns"].to_numpy(), calls["end_ns"].to_numpy())
    per_op = pd.Series(ends - starts, dtype="int64").groupby(op_of_key.loc[pieces].to_numpy()).sum()
    return {f"comm_ms:{op}": float(ns / NS_PER_MS / rank_steps) for op, ns in per_op.items()}


def _plain_id(value: object) -> object:
    if isinstance(value, (np.integer, np.floating)):
        value = value.item()
    if isinstance(value, float) and (math.isnan(value) or value.is_integer()):
        return None if math.isnan(value) else int(value)
    return value


def compare_figures(new: RunFigures, baseline: RunFigures, rules: Iterable[Rule] = ()) -> Comparison:
    """The Comparison of two runs' figures; a rule naming a metric neither run has is a TraceError."""
    result = Comparison(new, baseline, tuple(rules))
    missing = unknown_metrics(list(result.rules), {**result.new.metrics, **result.baseline.metrics})
    if missing:
        known = ", ".join(sorted({*result.new.metrics, *result.baseline.metrics}))
        raise TraceError(f"--fail-if: no metric {missing[0]!r} in these runs (known: {known})")
    return result


def rules_of(texts: Iterable[str | Rule]) -> list[Rule]:
    """--fail-if texts (or Rules) as Rules; a TraceError naming a malformed one."""
    try:
        return [parse_rule(t) if isinstance(t, str) else t for t in texts]
    except ValueError as e:
        raise TraceError(str(e)) from None


def check_apart(new: Iterable[str | Path], baseline: Iterable[str | Path]) -> None:
    """Refuse a file given as both the new run and the baseline."""
    if {Path(p).resolve() for p in new} & {Path(p).resolve() for p in baseline}:
        raise TraceError("a trace is given as both new and baseline")
