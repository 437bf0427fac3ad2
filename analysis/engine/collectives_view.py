"""The Python API behind `python -m analysis.collectives`: `analyze_collectives(paths) -> CollectivesView`."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from analysis.engine.runs import load_trace
from analysis.errors import TraceError
from analysis.frames.patterns import Patterns
from analysis.frames.phase_markers import phases_of
from analysis.frames.trace import Trace
from analysis.measures import collective_stats as stats
from analysis.measures.collective_rows import call_rows
from analysis.measures.in_time import in_time_sentences
from analysis.measures.op_phase import phase_labels
from analysis.measures.prefetch import PREFETCH_COLUMNS, prefetch_rows
from analysis.views.table import plain_records


@dataclass(frozen=True)
class CollectivesView:
    """`calls`: one row per call per rank (ROW_COLUMNS); `by_size`: per trace, op and size class;
    `by_rank`: per trace and rank; `stragglers`: per trace and step; `traces`: per trace, with
    source, world size, ranks present, a note when calls lack partners, `phases` (where the steps and
    phases came from) and `in_time` (the all-gather answer in words); `prefetch`: per trace, each
    forward all-gather (measures/prefetch.py)."""

    calls: pd.DataFrame
    by_size: pd.DataFrame
    by_rank: pd.DataFrame
    stragglers: pd.DataFrame
    traces: pd.DataFrame
    prefetch: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=["path", *PREFETCH_COLUMNS]))

    def to_json(self) -> dict:
        """{"traces": [{facts..., "calls": [...], "by_size": [...], "by_rank": [...], "stragglers": [...]}]}."""
        parts = {"calls": self.calls, "by_size": self.by_size, "by_rank": self.by_rank, "stragglers": self.stragglers}
        out = []
        for head in plain_records(self.traces):
            mine = {name: _records(f[f["path"] == head["path"]].drop(columns="path")) for name, f in parts.items()}
            out.append({**head, **mine})
        return {"traces": out}


def _records(frame: pd.DataFrame) -> list[dict]:
    """Rows as JSON-safe dicts (NaN -> None), encoded by pandas in C rather than row by row."""
    return json.loads(frame.to_json(orient="records", double_precision=15))


def _summaries(calls: pd.DataFrame, peak: float | None) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    by_size, by_rank, strag = [], [], []
    for path, mine in calls.groupby("path", sort=False):  # one iteration per trace
        by_size.append(stats.by_size(mine).assign(path=path))
        by_rank.append(stats.by_rank(mine).assign(path=path))
        strag.append(stats.stragglers(mine).assign(path=path))
    frames = [
        pd.concat(f, ignore_index=True) if f else pd.DataFrame(columns=["path"]) for f in (by_size, by_rank, strag)
    ]
    if peak:
        for f in frames[:2]:
            f["median_busbw_pct_peak"] = 100.0 * f["median_busbw_gbps"] / peak
    return frames[0], frames[1], frames[2]


def collectives_of(
    traces: Iterable[Trace],
    patterns: Patterns | None = None,
    rank: int | None = None,
    step: int | None = None,
    peak_busbw: float | None = None,
) -> CollectivesView:
    """The view of loaded traces; rank/step keep only that rank's/step's calls (stragglers use every
    rank of the kept steps); peak_busbw (GB/s) adds busbw as % of that peak."""
    rows, facts, prefetch = zip(*(_with_in_time(t, *call_rows(t, patterns), patterns) for t in traces), strict=True)
    calls = pd.concat(rows, ignore_index=True)
    gathers = pd.concat(prefetch, ignore_index=True)
    for name, value in (("step", step), ("rank", rank)):
        have = sorted(calls[name].unique().tolist())
        if value is not None and value not in have:
            raise TraceError(f"--{name} {value}: no collective call has it (the trace(s) have {name}s {have})")
    if step is not None:
        calls = calls[calls["step"] == step]
    if peak_busbw:
        calls = calls.assign(busbw_pct_peak=100.0 * calls["busbw_gbps"] / peak_busbw)
    every_rank = calls
    if rank is not None:
        calls = calls[calls["rank"] == rank]
    by_size, by_rank, _ = _summaries(calls, peak_busbw)
    stragglers = _summaries(every_rank, None)[2]
    if step is not None:
        gathers = gathers[gathers["step"] == step]
    facts_frame = pd.DataFrame(list(facts))
    return CollectivesView(calls.reset_index(drop=True), by_size, by_rank, stragglers, facts_frame, gathers)


def _with_in_time(
    trace: Trace, rows: pd.DataFrame, facts: dict, patterns: Patterns | None
) -> tuple[pd.DataFrame, dict, pd.DataFrame]:
    """The trace's rows; its facts with `in_time`: whether its all-gathers came in time, in words
    (in_time.py) and `phases`: where its steps and phases came from (frames/phase_markers.py); its
    forward all-gathers' prefetch rows (prefetch.py)."""
    ranks = trace.ranks[["rank", "part", "pid"]].drop_duplicates("rank")
    where = rows[["rank", "issue_ns", "phase"]].merge(ranks, on="rank", how="left")
    phases = phase_labels(trace, where, patterns)
    gathers = prefetch_rows(trace, rows, phases).assign(path=trace.path)
    return rows, {**facts, "phases": phases_of(trace), "in_time": in_time_sentences(rows, phases)}, gathers


def analyze_collectives(
    paths: str | Path | Iterable[str | Path], patterns: Patterns | None = None, merge: bool = False, **options: Any
) -> CollectivesView:
    """Each path its own trace, or (merge=True) all paths one run (one rank per file); options as collectives_of."""
    paths = [Path(paths)] if isinstance(paths, (str, Path)) else [Path(p) for p in paths]
    groups = [paths] if merge else [[p] for p in paths]
    return collectives_of((load_trace(g, patterns) for g in groups), patterns, **options)
