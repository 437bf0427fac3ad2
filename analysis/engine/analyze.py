"""The Python API behind `python -m analysis.overlap`: `analyze(paths) -> Analysis`, `analyze_trace(trace)`.

See measures/metrics.py for what each metric means.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from analysis.errors import TraceError
from analysis.frames.patterns import Patterns
from analysis.frames.phase_markers import phases_of
from analysis.frames.run_info import MEMORY_COLUMNS, profiler_label, trace_metadata
from analysis.frames.trace import CLOCK_NOTE_KEY, Trace
from analysis.measures.activity import RankWork, rank_work
from analysis.measures.collective_calls import Calls, find_calls
from analysis.measures.collective_rows import call_rows, with_comm_split
from analysis.measures.comm_recognition import unrecognised_comm_note
from analysis.measures.metrics import METRICS, SOURCES, measure_trace, summarise
from analysis.measures.op_phase import OP_PHASE_COLUMNS, op_phase_rows, phase_labels
from analysis.measures.pairing import world_size
from analysis.readers.nsys_export import export_report, is_report, report_error
from analysis.views.table import plain_records

TRACE_KEYS = ["path", "implementation", "source", "profiler"]


RANK_KEYS = ["rank", "pid", "device"]


METADATA = [
    "gpus",
    "driver",
    "cuda_driver",
    "cuda",
    "nccl",
    "torch",
    "backend",
    "world_size",
    "model",
    "shared_gpus",
    *MEMORY_COLUMNS,
]  # summary columns from run_info.trace_metadata


# summary columns of what the reader should know: where the phases came from (frames/phase_markers.py),
# and notes ('' when nothing to say)
NOTES = ["phases", "comm_note", "clock_note"]


@dataclass(frozen=True)
class Analysis:
    """Results for one or more traces. `steps`: one row per trace, rank and step (after skipping);
    `totals`: one row per trace and rank over the whole capture; `summary`: one row per trace,
    metrics averaged over its steps and ranks, plus the run's metadata (METADATA columns). Each frame
    carries the trace keys (path, implementation, source, profiler); steps and totals carry each
    rank's comm_source, compute_source and shared_gpu. `by_op_phase`: communication per rank, op and
    phase (measures/op_phase.py), one row per step (kept steps) and one per rank with step NA (the
    whole capture), with the trace keys."""

    steps: pd.DataFrame
    totals: pd.DataFrame
    summary: pd.DataFrame
    by_op_phase: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=["path", *OP_PHASE_COLUMNS]))

    def to_json(self) -> dict:
        """The CLI's JSON document: {"traces": [{path, implementation, source, profiler, metadata,
        ranks: [{rank, pid, device, comm_source, compute_source, shared_gpu, steps, total}], summary}]};
        each step and each total carries its `by_op_phase` rows (op, phase, calls, bytes, comm_ms,
        hidden_ms, exposed_ms)."""
        split: dict[tuple, list] = {}
        for row in plain_records(self.by_op_phase, ["path", *OP_PHASE_COLUMNS]):
            split.setdefault((row.pop("path"), row.pop("rank"), row.pop("step")), []).append(row)
        steps: dict[tuple, list] = {}
        for row in plain_records(self.steps, ["path", "rank", "step", *METRICS]):
            path, rank = row.pop("path"), row.pop("rank")
            row["by_op_phase"] = split.get((path, rank, row["step"]), [])  # step None: the whole capture
            steps.setdefault((path, rank), []).append(row)
        ranks: dict[str, list] = {}
        sources = [c for c in SOURCES if c in self.totals]
        for row in plain_records(self.totals, ["path", *RANK_KEYS, *sources, *METRICS]):
            path = row.pop("path")
            ident = {k: row.pop(k) for k in [*RANK_KEYS, *sources]}
            row["by_op_phase"] = split.get((path, ident["rank"], None), [])
            ranks.setdefault(path, []).append({**ident, "steps": steps.get((path, ident["rank"]), []), "total": row})
        traces = []
        metadata = [c for c in METADATA if c in self.summary]
        notes = [c for c in NOTES if c in self.summary]
        for head in plain_records(self.summary, [*TRACE_KEYS, *metadata, *notes, "ranks", "steps", *METRICS]):
            trace = {k: head.pop(k) for k in TRACE_KEYS}
            about = {k: head.pop(k) for k in metadata}
            said = {k: head.pop(k) or "" for k in notes}
            traces.append({**trace, "metadata": about, **said, "ranks": ranks.get(trace["path"], []), "summary": head})
        return {"traces": traces}


def _skip_first_steps(per_step: pd.DataFrame, n: int) -> pd.DataFrame:
    if n <= 0:
        return per_step
    order = per_step.groupby("rank").cumcount()
    return per_step[(order >= n) | per_step["step"].isna()].reset_index(drop=True)


def analyze_trace(
    trace: Trace,
    patterns: Patterns | None = None,
    skip_steps: int = 0,
    calls: Calls | None = None,
    works: list[RankWork] | None = None,
) -> Analysis:
    """Metrics of one loaded trace (`calls`: its collective_calls.find_calls, `works`: its
    activity.rank_work, when the caller has them already)."""
    if works is None:  # the interval sets both the metrics and the collectives' split use
        works = rank_work(trace, patterns)
    per_step, totals = measure_trace(trace, patterns, works)
    calls = calls if calls is not None else find_calls(trace, patterns, works)
    rows = call_rows(trace, patterns, works, calls)[0]
    per_step, totals = with_comm_split(per_step, totals, rows)  # collectives view
    per_step = _skip_first_steps(per_step, skip_steps)
    summary = trace_summary(trace, per_step)
    summary["comm_note"] = unrecognised_comm_note(
        trace, patterns or Patterns(), world_size(trace.meta, len(trace.ranks))
    )
    summary["clock_note"] = str(trace.info.get(0, {}).get(CLOCK_NOTE_KEY, ""))
    summary["phases"] = phases_of(trace)
    split = by_op_phase(trace, calls, per_step, patterns)
    for frame in (per_step, totals, split):
        for i, (k, v) in enumerate(trace_keys(trace).items()):
            frame.insert(i, k, v)
    return Analysis(per_step, totals, summary, split)


def by_op_phase(trace: Trace, calls: Calls, per_step: pd.DataFrame, patterns: Patterns | None = None) -> pd.DataFrame:
    """op_phase_rows of the trace's calls: per kept step (the steps in per_step), then per rank over the
    whole capture (step NA)."""
    labelled = calls.frame.assign(phase=phase_labels(trace, calls.frame, patterns))
    kept = per_step[["rank", "step"]].dropna().astype({"step": "int64"})
    steps = op_phase_rows(labelled, calls.compute).merge(kept, on=["rank", "step"], how="inner")
    rows = [frame for frame in (steps, op_phase_rows(labelled, calls.compute, per_step=False)) if len(frame)]
    if not rows:
        return pd.DataFrame({c: pd.Series(dtype=object) for c in OP_PHASE_COLUMNS})
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
    """One row: the trace keys, the run's metadata (METADATA) and the metrics averaged over per_step.
    Needs only the trace's ranks, meta and info (rank_merge calls it on a merged run's)."""
    about = trace_metadata(trace)
    about["shared_gpus"] = "; ".join(",".join(map(str, g)) for g in about["shared_gpus"] or []) or None
    return pd.DataFrame([{**trace_keys(trace), **{k: about[k] for k in METADATA}, **summarise(per_step)}])


def _resolve(path: Path, export: bool) -> Path:
    if is_report(path) and path.exists():
        if not export:
            raise report_error(path)
        return export_report(path)
    return path


def analyze(
    paths: str | Path | Iterable[str | Path],
    patterns: Patterns | None = None,
    skip_steps: int = 0,
    merge: bool = False,
    export: bool = False,
    progress: Callable[[str], object] | None = None,
    jobs: int = 1,
    dask: str | None = None,
) -> Analysis:
    """Analyse each path as its own trace, or (merge=True) all paths as one-rank files of one run;
    files run in `jobs` processes or on the Dask cluster at `dask` (see parallel.py, groups.py).
    Raises TraceError naming every file that failed."""
    from analysis.engine.groups import analyze_groups, concat_analyses  # deferred: it builds on this module
    from analysis.engine.parallel import Progress

    if skip_steps < 0:
        raise TraceError(f"skip_steps={skip_steps}: must be >= 0")
    groups = input_groups(paths, merge, export)
    shown = Progress(sum(map(len, groups)), "", after_s=0, write=progress) if progress else None
    done = analyze_groups(groups, patterns, skip_steps, jobs, dask, shown)
    errors = [e for g in done for e in g.errors]
    if errors:
        raise TraceError(errors[0] if len(errors) == 1 else f"{len(errors)} files failed: {'; '.join(errors)}")
    return concat_analyses([g.merged.analysis for g in done if g.merged is not None])


def input_groups(paths: str | Path | Iterable[str | Path], merge: bool, export: bool) -> list[list[Path]]:
    given = [Path(paths)] if isinstance(paths, (str, Path)) else [Path(p) for p in paths]
    if not given:
        raise TraceError("no trace path given")
    resolved = [_resolve(p, export) for p in given]
    return [resolved] if merge else [[p] for p in resolved]


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
