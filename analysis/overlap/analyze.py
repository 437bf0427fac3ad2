"""The overlap metrics of one loaded run: `analyze_run(loaded) -> Analysis` (`analyze_trace(trace)` for a bare Trace).

See overlap/metrics.py for what each metric means.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields

import pandas as pd

from analysis.collectives.collective_rows import call_rows, with_comm_split
from analysis.errors import TraceError
from analysis.measure.call_groups import world_size
from analysis.measure.collective_calls import Calls
from analysis.measure.comm_breakdown import (
    GROUP_FIGURES,
    OP_PHASE_COLUMNS,
    empty_group_rows,
    group_overlap_rows,
    op_phase_rows,
    phase_labels,
)
from analysis.measure.comm_recognition import unrecognised_comm_note
from analysis.overlap.metrics import METRICS, SOURCES, measure_trace, summarise
from analysis.render.table import plain_records
from analysis.run.loaded_run import LoadedRun, measure_run
from analysis.trace.frames import CLOCK_NOTE_KEY, Trace
from analysis.trace.patterns import Patterns
from analysis.trace.phase_markers import phases_of
from analysis.trace.run_info import MEMORY_COLUMNS, profiler_label, trace_metadata

TRACE_KEYS = ["path", "implementation", "source", "profiler"]


RANK_KEYS = ["rank", "pid", "device"]


METADATA = [
    "gpus",
    "driver",
    "cuda_driver",
    "cuda",
    "nccl",
    "nccl_build",
    "torch",
    "backend",
    "world_size",
    "model",
    "shared_gpus",
    *MEMORY_COLUMNS,
]  # summary columns from run_info.trace_metadata


# summary columns of what the reader should know: where the phases came from (trace/phase_markers.py),
# then notes ('' when nothing to say): communication not recognised (comm_recognition.py), ranks of
# the run missing from the input (missing_ranks_note), how the files' clocks were aligned (clocks.clock_note)
NOTES = ["phases", "comm_note", "ranks_note", "clock_note"]


@dataclass(frozen=True)
class Analysis:
    """Results for one or more traces. `steps`: one row per trace, rank and step (after skipping);
    `totals`: one row per trace and rank over the whole capture; `summary`: one row per trace,
    metrics averaged over its steps and ranks, plus the run's metadata (METADATA columns). Each frame
    carries the trace keys (path, implementation, source, profiler); steps and totals carry each
    rank's comm_source, compute_source and shared_gpu. `by_op_phase`: communication per rank, op and
    phase (measure/comm_breakdown.py), one row per step (kept steps) and one per rank with step NA (the
    whole capture), with the trace keys. `by_group`: communication per rank and process group over the
    whole capture (measure/comm_breakdown.py), with the trace keys."""

    steps: pd.DataFrame
    totals: pd.DataFrame
    summary: pd.DataFrame
    by_op_phase: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=["path", *OP_PHASE_COLUMNS]))
    by_group: pd.DataFrame = field(default_factory=lambda: empty_group_rows().assign(path=pd.Series(dtype=object)))

    def to_json(self) -> dict:
        """The CLI's JSON document: {"traces": [{path, implementation, source, profiler, metadata,
        ranks: [{rank, pid, device, comm_source, compute_source, shared_gpu, steps, total}], summary}]};
        each step and each total carries its `by_op_phase` rows (op, phase, calls, bytes, comm_ms,
        hidden_ms, exposed_ms); each rank its `groups` (group, comm_ms, overlap_ms, exposed_comm_ms, overlap_pct,
        calls: comm_breakdown.py; group as the collectives JSON gives it, null where inferred)."""
        split: dict[tuple, list] = {}
        for row in plain_records(self.by_op_phase, ["path", *OP_PHASE_COLUMNS]):
            split.setdefault((row.pop("path"), row.pop("rank"), row.pop("step")), []).append(row)
        steps: dict[tuple, list] = {}
        for row in plain_records(self.steps, ["path", "rank", "step", *METRICS]):
            path, rank = row.pop("path"), row.pop("rank")
            row["by_op_phase"] = split.get((path, rank, row["step"]), [])  # step None: the whole capture
            steps.setdefault((path, rank), []).append(row)
        by_group = self._groups_json()
        ranks: dict[str, list] = {}
        sources = [c for c in SOURCES if c in self.totals]
        for row in plain_records(self.totals, ["path", *RANK_KEYS, *sources, *METRICS]):
            path = row.pop("path")
            ident = {k: row.pop(k) for k in [*RANK_KEYS, *sources]}
            row["by_op_phase"] = split.get((path, ident["rank"], None), [])
            groups = by_group.get((path, ident["rank"]), [])
            ranks.setdefault(path, []).append(
                {**ident, "steps": steps.get((path, ident["rank"]), []), "total": row, "groups": groups}
            )
        traces = []
        metadata = [c for c in METADATA if c in self.summary]
        notes = [c for c in NOTES if c in self.summary]
        for head in plain_records(self.summary, [*TRACE_KEYS, *metadata, *notes, "ranks", "steps", *METRICS]):
            trace = {k: head.pop(k) for k in TRACE_KEYS}
            about = {k: head.pop(k) for k in metadata}
            said = {k: head.pop(k) or "" for k in notes}
            traces.append({**trace, "metadata": about, **said, "ranks": ranks.get(trace["path"], []), "summary": head})
        return {"traces": traces}

    def _groups_json(self) -> dict[tuple, list]:
        """(path, rank) -> that rank's `groups` entries."""
        from analysis.measure.call_groups import group_objects

        frame = self.by_group
        world = dict(zip(self.summary["path"], self.summary.get("world_size", pd.Series(dtype=object)), strict=False))
        out: dict[tuple, list] = {}
        for path, mine in frame.groupby("path", sort=False):  # one pass per run
            known = world.get(path)
            size = int(known) if isinstance(known, (int, float)) and known == known else int(mine["rank"].max()) + 1
            shown = mine.assign(group=group_objects(mine, size))
            for row in plain_records(shown, ["rank", "group", *GROUP_FIGURES]):
                out.setdefault((path, row.pop("rank")), []).append(row)
        return out


def _skip_first_steps(per_step: pd.DataFrame, n: int, path: str) -> pd.DataFrame:
    """Each rank's rows without its first n steps; a TraceError when that leaves no step at all."""
    if n <= 0:
        return per_step
    stepped = per_step[per_step["step"].notna()]
    counts = stepped.groupby("rank").size()
    if len(counts) and n >= int(counts.max()):
        raise TraceError(f"--skip-steps {n}: {path} has {_steps_text(stepped)} per rank; no step would be left")
    order = per_step.groupby("rank").cumcount()
    return per_step[(order >= n) | per_step["step"].isna()].reset_index(drop=True)


def _steps_text(steps: pd.DataFrame) -> str:
    """'10 steps (0-9)', '3 steps (2, 5, 9)' or 'no steps'."""
    have = sorted({int(s) for s in steps["step"].dropna()})
    if not have:
        return "no steps"
    counts = steps[steps["step"].notna()].groupby("rank").size()
    n = int(counts.min()) if counts.min() == counts.max() else f"{int(counts.min())}-{int(counts.max())}"
    listed = f"{have[0]}-{have[-1]}" if have == list(range(have[0], have[-1] + 1)) else ", ".join(map(str, have))
    return f"{n} steps ({listed})"


def analyze_trace(trace: Trace, patterns: Patterns | None = None, *, skip_steps: int = 0) -> Analysis:
    """Metrics of one loaded trace: analyze_run of the trace measured here (loaded_run.measure_run)."""
    return analyze_run(measure_run(trace, patterns), skip_steps=skip_steps)


def analyze_run(
    run: LoadedRun, *, skip_steps: int = 0, rows: pd.DataFrame | None = None, op_phase: bool = True
) -> Analysis:
    """The overlap metrics of a loaded run, from its activity and collective calls (`rows`: its
    collective_rows.call_rows rows, when the caller has them already); op_phase=False: its by_op_phase
    not measured, left without rows (for a caller that shows no op/phase split: the report)."""
    trace, patterns = run.trace, run.patterns
    per_step, totals = measure_trace(trace, patterns, run.works)
    if rows is None:
        rows = call_rows(trace, patterns, run.works, run.calls)[0]
    per_step, totals = with_comm_split(per_step, totals, rows)  # collectives view
    per_step = _skip_first_steps(per_step, skip_steps, trace.path)
    summary = trace_summary(trace, per_step)
    summary["comm_note"] = unrecognised_comm_note(trace, patterns, world_size(trace.meta, len(trace.ranks)))
    summary["clock_note"] = str(trace.info.get(0, {}).get(CLOCK_NOTE_KEY, ""))
    summary["phases"] = phases_of(trace)
    split = by_op_phase(trace, run.calls, per_step, patterns) if op_phase else _no_op_phase_rows()
    groups = group_overlap_rows(run.calls.frame, run.calls.compute)
    for frame in (per_step, totals, split, groups):
        for i, (k, v) in enumerate(trace_keys(trace).items()):
            frame.insert(i, k, v)
    return Analysis(per_step, totals, summary, split, groups)


def _no_op_phase_rows() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=object) for c in OP_PHASE_COLUMNS})


def by_op_phase(trace: Trace, calls: Calls, per_step: pd.DataFrame, patterns: Patterns | None = None) -> pd.DataFrame:
    """op_phase_rows of the trace's calls: per kept step (the steps in per_step), then per rank over the
    whole capture (step NA)."""
    labelled = calls.frame.assign(phase=phase_labels(trace, calls.frame, patterns))
    kept = per_step[["rank", "step"]].dropna().astype({"step": "int64"})
    steps = op_phase_rows(labelled, calls.compute).merge(kept, on=["rank", "step"], how="inner")
    rows = [frame for frame in (steps, op_phase_rows(labelled, calls.compute, per_step=False)) if len(frame)]
    if not rows:
        return _no_op_phase_rows()
    out = pd.concat(rows, ignore_index=True)
    return out.astype({"step": "Int64"})


def trace_keys(trace: Trace) -> dict:
    return {
        "path": trace.path,
        "implementation": trace.implementation,
        "source": trace.source,
        "profiler": profiler_label(trace),
    }


def trace_summary(trace: Trace, per_step: pd.DataFrame) -> pd.DataFrame:
    """One row: the trace keys, the run's metadata (METADATA), the metrics averaged over per_step and
    ranks_note (missing ranks). Needs only the trace's ranks, meta and info (rank_merge calls it on
    a merged run's)."""
    about = trace_metadata(trace)
    about["shared_gpus"] = "; ".join(",".join(map(str, g)) for g in about["shared_gpus"] or []) or None
    note = missing_ranks_note(trace.ranks["rank"].tolist(), about["world_size"])
    return pd.DataFrame(
        [{**trace_keys(trace), **{k: about[k] for k in METADATA}, **summarise(per_step), "ranks_note": note}]
    )


def missing_ranks_note(ranks: list[int], world_size: object) -> str:
    """'ranks 0 of 2: ...' when the run recorded a larger world size than the ranks given, else ''."""
    if not isinstance(world_size, int) or isinstance(world_size, bool) or len(ranks) >= world_size:
        return ""
    listed = ", ".join(str(int(r)) for r in sorted(ranks))
    return (
        f"ranks {listed} of {world_size}: the run's other ranks are not in the input "
        "(give every rank's file, with --merge for files not named <run>.rank<N>)"
    )


def concat_analyses(analyses: Sequence[Analysis]) -> Analysis:
    """Several analyses as one, rows in the given order."""
    return Analysis(
        **{f.name: pd.concat([getattr(a, f.name) for a in analyses], ignore_index=True) for f in fields(Analysis)}
    )


def check_selection(result: Analysis, step: int | None = None, rank: int | None = None) -> None:
    """The one check of --step/--rank against the trace(s): a TraceError naming the ranks present when
    `rank` is not one, or the steps present (on that rank) when `step` is not one. Every CLI and
    session.OpenRuns reach it (OpenRuns.check_selection, selected)."""
    steps = result.steps
    if rank is not None:
        have = sorted({int(r) for r in result.totals["rank"]})
        if rank not in have:
            raise TraceError(f"--rank {rank}: the input has ranks {', '.join(map(str, have))}")
        steps = steps[steps["rank"] == rank]
    if step is not None and step not in set(steps["step"].dropna().astype(int)):
        raise TraceError(f"--step {step}: the input has {_steps_text(steps)}")


def selected(result: Analysis, step: int | None = None, rank: int | None = None) -> Analysis:
    """Only step `step` and rank `rank` (None: all), the summary averaged over what is kept; a
    TraceError naming the steps or ranks present when one is not."""
    if step is None and rank is None:
        return result
    check_selection(result, step, rank)
    steps, totals, split, groups = result.steps, result.totals, result.by_op_phase, result.by_group
    if rank is not None:
        steps, totals, split, groups = (
            steps[steps["rank"] == rank],
            totals[totals["rank"] == rank],
            split[split["rank"] == rank],
            groups[groups["rank"] == rank],
        )
    if step is not None:
        steps, split = steps[steps["step"] == step], split[split["step"] == step]
    rows = []
    for head in result.summary.to_dict("records"):  # one per trace
        rows.append({**head, **summarise(steps[steps["path"] == head["path"]])})
    summary = pd.DataFrame(rows, columns=result.summary.columns)
    return Analysis(
        steps.reset_index(drop=True),
        totals.reset_index(drop=True),
        summary,
        split.reset_index(drop=True),
        groups.reset_index(drop=True),
    )


PER_RANK_KEYS = [*TRACE_KEYS, *RANK_KEYS]


def per_rank_table(result: Analysis) -> pd.DataFrame:
    """One row per trace and rank over the kept steps (after --skip-steps): the trace and rank keys,
    `steps` (that rank's step count), every metric as a mean per step (overlap_pct from the means),
    then where the figures come from (comm_source, compute_source) and shared_gpu."""
    keys = [*PER_RANK_KEYS, *[c for c in SOURCES if c in result.steps]]
    notes = [c for c in NOTES if c in result.summary]
    said = result.summary.set_index("path")[notes].to_dict("index") if notes else {}
    rows = []
    for (path, _), steps in result.steps.groupby(["path", "rank"], sort=False):  # one pass per rank
        s = summarise(steps)
        first = steps[keys].iloc[0].to_dict()
        rows.append({**first, "steps": s["steps"], **{m: s[m] for m in METRICS}, **said.get(path, {})})
    return pd.DataFrame(rows, columns=[*PER_RANK_KEYS, "steps", *METRICS, *keys[len(PER_RANK_KEYS) :], *notes])
