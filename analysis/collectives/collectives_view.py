"""The collectives view of runs' call rows: `collectives_of(traces)`, `view_of_rows(rows)` -> CollectivesView."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import pandas as pd

from analysis.collectives import collective_stats as stats
from analysis.collectives.collective_rows import call_rows
from analysis.collectives.straggler_cause import straggler_summary, with_causes
from analysis.errors import TraceError
from analysis.fsdp_units.gather_rows import GATHER_COLUMNS, PREFETCH_COLUMNS, gather_rows
from analysis.fsdp_units.in_time import in_time_sentences
from analysis.measure.call_groups import FOLDED, folded_summary, group_objects
from analysis.measure.collective_calls import OUTSIDE_STEPS
from analysis.measure.comm_breakdown import phase_labels
from analysis.measure.rank_spans import empty_spans, rank_spans
from analysis.render.table import plain_records
from analysis.run.loaded_run import LoadedRun, measure_run
from analysis.trace.frames import Trace
from analysis.trace.patterns import Patterns
from analysis.trace.phase_markers import phases_of

# What run_call_rows gives per run: call rows, facts, gather rows, host spans (measure/rank_spans.py)
RunRows = tuple[pd.DataFrame, dict, pd.DataFrame, pd.DataFrame]


class Summaries:
    """Per trace: `by_size` and `by_rank` of the kept calls, `stragglers` of every rank's calls of the kept
    steps (collective_stats.py) with their causes and `straggler_summary` per rank (straggler_cause.py, from
    the ranks' host `spans`); each computed the first time it is asked for (the report draws from the calls
    alone, the collectives CLI prints them)."""

    def __init__(
        self,
        calls: pd.DataFrame,
        every_rank: pd.DataFrame,
        peak_busbw: float | None = None,
        spans: pd.DataFrame | None = None,
    ):
        self._calls, self._every_rank, self._peak = calls, every_rank, peak_busbw
        self._spans = spans if spans is not None else empty_spans().assign(path="")

    def _with_peak(self, frame: pd.DataFrame) -> pd.DataFrame:
        if self._peak and "median_busbw_gbps" in frame:
            frame["median_busbw_pct_peak"] = 100.0 * frame["median_busbw_gbps"] / self._peak
        return frame

    @cached_property
    def by_size(self) -> pd.DataFrame:
        return self._with_peak(_per_trace(self._calls, stats.by_size))

    @cached_property
    def by_rank(self) -> pd.DataFrame:
        return self._with_peak(_per_trace(self._calls, stats.by_rank))

    @cached_property
    def by_group(self) -> pd.DataFrame:
        return self._with_peak(_per_trace(self._calls, stats.by_group))

    @cached_property
    def by_host_scope(self) -> pd.DataFrame:
        return self._with_peak(_per_trace(self._calls, stats.by_host_scope))

    @cached_property
    def stragglers(self) -> pd.DataFrame:
        return _per_trace(self._every_rank, self._stragglers_of)

    def _stragglers_of(self, calls: pd.DataFrame) -> pd.DataFrame:
        spans = self._spans[self._spans["path"] == calls["path"].iloc[0]]
        return with_causes(stats.stragglers(calls), calls, spans)

    @cached_property
    def straggler_summary(self) -> pd.DataFrame:
        """Per trace and rank that held a step: straggler_cause.straggler_summary."""
        world = self._every_rank.groupby("path", sort=False)["rank"].nunique()
        parts = [
            straggler_summary(mine, int(world.get(path, 0))).assign(path=path)
            for path, mine in self.stragglers.groupby("path", sort=False)
        ]
        return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=["path"])


@dataclass(frozen=True)
class CollectivesView:
    """`calls`: one row per call per rank (ROW_COLUMNS; a call issued outside the steps of a rank that
    has steps, such as the closing barrier, has phase "outside steps" and is left out of the summaries);
    `by_size`: per trace, op and size class; `by_rank`: per trace and rank; `stragglers`: per trace and
    step (those three computed when first asked for: Summaries); `traces`: per trace, with source,
    world size, ranks present, a note when calls lack partners, `outside_steps_calls`, `phases` (where
    the steps and phases came from) and `in_time` (the all-gather answer in words); `gathers`: per
    trace, each all-gather of a step's forward or backward per rank, whether it was in time and why not
    (fsdp_units/gather_rows.py); `prefetch`: its forward rows as fsdp_units/gather_rows.py's PREFETCH_COLUMNS; `path`:
    the one trace this view keeps (only), None for every trace."""

    calls: pd.DataFrame
    traces: pd.DataFrame
    summaries: Summaries
    gathers: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=["path", *GATHER_COLUMNS]))
    path: str | None = None

    @property
    def prefetch(self) -> pd.DataFrame:
        """The forward gathers as PREFETCH_COLUMNS (waited_ns: the rows' held or waited time, in ns)."""
        mine = self.gathers[self.gathers["phase"] == "forward"]
        held = np.round(mine["held_ms"].fillna(0).to_numpy(float) * 1e6).astype(np.int64)
        out = mine.assign(tag=mine["unit"], waited_ns=held)
        return out[["path", *PREFETCH_COLUMNS]].reset_index(drop=True)

    def _mine(self, frame: pd.DataFrame) -> pd.DataFrame:
        return frame if self.path is None else frame[frame["path"] == self.path].reset_index(drop=True)

    @property
    def by_size(self) -> pd.DataFrame:
        return self._mine(self.summaries.by_size)

    @property
    def by_rank(self) -> pd.DataFrame:
        return self._mine(self.summaries.by_rank)

    @property
    def stragglers(self) -> pd.DataFrame:
        return self._mine(self.summaries.stragglers)

    @property
    def by_group(self) -> pd.DataFrame:
        return self._mine(self.summaries.by_group)

    @property
    def straggler_summary(self) -> pd.DataFrame:
        return self._mine(self.summaries.straggler_summary)

    @property
    def by_host_scope(self) -> pd.DataFrame:
        return self._mine(self.summaries.by_host_scope)

    def to_json(self) -> dict:
        """{"traces": [{facts..., "calls": [...], "by_size": [...], "by_rank": [...], "stragglers": [...],
        "straggler_summary": [...], "gathers": [...], "groups_folded": [...]}]} (groups_folded:
        call_groups.folded_summary, the inferred calls counted in a named group)."""
        parts = {
            "calls": _with_group_objects(self.calls, self.traces),
            "by_size": self.by_size,
            "by_rank": self.by_rank,
            "stragglers": self.stragglers,
            "by_group": self.by_group,
            "straggler_summary": self.straggler_summary,
            "by_host_scope": self.by_host_scope,
            "gathers": self.gathers.drop(columns=["issue_ns", "end_ns", "needed_ns"]),
        }
        out = []
        for head in plain_records(self.traces):
            mine = {name: _records(f[f["path"] == head["path"]].drop(columns="path")) for name, f in parts.items()}
            world = int(head.get("world_size") or 0)
            folded = folded_summary(self.calls[self.calls["path"] == head["path"]], world)
            out.append({**head, **mine, "groups_folded": folded})
        return {"traces": out}

    def only(self, path: str) -> CollectivesView:
        """The view of one run (its `path`)."""
        calls, traces, gathers = (
            f[f["path"] == path].reset_index(drop=True) for f in (self.calls, self.traces, self.gathers)
        )
        return CollectivesView(calls, traces, self.summaries, gathers, path)


def _with_group_objects(calls: pd.DataFrame, traces: pd.DataFrame) -> pd.DataFrame:
    """The calls with `group` as the JSON gives it (call_groups.group_objects: its name, description, members
    and dimension; null where inferred) and `group_inferred`, in place of the group columns."""
    world = dict(zip(traces["path"], traces["world_size"], strict=True)) if "world_size" in traces else {}
    groups = pd.Series(None, index=calls.index, dtype=object)
    for path, rows in calls.groupby("path", sort=False).indices.items():  # one pass per run
        groups.iloc[rows] = group_objects(calls.iloc[rows], int(world.get(path, calls["rank"].max() + 1)))
    return calls.drop(columns=["group_desc", "group_ranks", FOLDED], errors="ignore").assign(group=groups)


def _records(frame: pd.DataFrame) -> list[dict]:
    """Rows as JSON-safe dicts (NaN -> None), encoded by pandas in C rather than row by row."""
    return json.loads(frame.to_json(orient="records", double_precision=15))


def _per_trace(calls: pd.DataFrame, summary: Callable[[pd.DataFrame], pd.DataFrame]) -> pd.DataFrame:
    """summary() of each trace's calls, with its path."""
    parts = [summary(mine).assign(path=path) for path, mine in calls.groupby("path", sort=False)]  # per trace
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=["path"])


def collectives_of(
    traces: Iterable[Trace],
    patterns: Patterns | None = None,
    rank: int | None = None,
    step: int | None = None,
    peak_busbw: float | None = None,
    skip_steps: int = 0,
) -> CollectivesView:
    """The view of loaded traces (see view_of_rows for the options)."""
    return view_of_rows((run_call_rows(measure_run(t, patterns)) for t in traces), rank, step, peak_busbw, skip_steps)


def _skip_first_steps(calls: pd.DataFrame, n: int) -> pd.DataFrame:
    """The calls without each trace's ranks' first n step numbers (calls outside steps stay); a
    TraceError when that leaves no step at all."""
    if n <= 0:
        return calls
    stepped = calls[calls["step"].notna()]
    order = stepped.groupby(["path", "rank"])["step"].rank(method="dense")
    counts = order.groupby([stepped["path"], stepped["rank"]]).max()
    if len(counts) and n >= int(counts.max()):
        have = sorted({int(s) for s in stepped["step"]})
        raise TraceError(f"--skip-steps {n}: the calls fall in {len(have)} steps ({have[0]}-{have[-1]}) per rank")
    keep = pd.Series(True, index=calls.index)
    keep[stepped.index] = order > n
    return calls[keep]


def view_of_rows(
    triples: Iterable[RunRows],
    rank: int | None = None,
    step: int | None = None,
    peak_busbw: float | None = None,
    skip_steps: int = 0,
) -> CollectivesView:
    """The view of runs' call rows, facts, gather rows and host spans (run_call_rows of each); rank/step keep
    only that rank's/step's calls (stragglers use every rank of the kept steps), skip_steps leaves
    each rank's first steps out; peak_busbw (GB/s) adds busbw as % of that peak. A step or rank the
    calls do not have is a TraceError naming those they have."""
    rows, facts, prefetch, spans = zip(*triples, strict=True)
    calls = _skip_first_steps(pd.concat(rows, ignore_index=True), skip_steps)
    gathers = pd.concat(prefetch, ignore_index=True)
    for name, value in (("step", step), ("rank", rank)):
        have = sorted(int(v) for v in calls[name].dropna().unique())
        if value is not None and value not in have:
            listed = ", ".join(map(str, have)) or "none"
            raise TraceError(f"--{name} {value}: no collective call has it (the calls have {name}s {listed})")
    if step is not None:
        calls = calls[calls["step"] == step]
    if peak_busbw:
        calls = calls.assign(busbw_pct_peak=100.0 * calls["busbw_gbps"] / peak_busbw)
    every_rank = calls
    if rank is not None:
        calls = calls[calls["rank"] == rank]
    # calls outside the steps (the closing barrier) are listed, labelled, but are not training collectives
    training = lambda frame: frame[frame["phase"] != OUTSIDE_STEPS]
    spans_frame = pd.concat(spans, ignore_index=True)
    # stragglers: every rank, whatever `rank`
    summaries = Summaries(training(calls), training(every_rank), peak_busbw, spans_frame)
    if step is not None:
        gathers = gathers[gathers["step"] == step]
    outside = calls.loc[calls["phase"] == OUTSIDE_STEPS, "path"].value_counts()
    facts_frame = pd.DataFrame(list(facts))
    if "path" in facts_frame:
        facts_frame["outside_steps_calls"] = facts_frame["path"].map(outside).fillna(0).astype(int)
    return CollectivesView(calls.reset_index(drop=True), facts_frame, summaries, gathers)


def run_call_rows(run: LoadedRun) -> RunRows:
    """collective_rows.call_rows of a loaded run (from its calls, found once), its facts with `in_time`,
    its gather rows (see _with_in_time) and its ranks' host spans (measure/rank_spans.py)."""
    rows, facts, gathers = _with_in_time(
        run.trace, *call_rows(run.trace, run.patterns, run.works, run.calls), run.patterns
    )
    return rows, facts, gathers, rank_spans(run.trace, run.patterns, run.step_ranges).assign(path=run.trace.path)


def _with_in_time(
    trace: Trace, rows: pd.DataFrame, facts: dict, patterns: Patterns | None
) -> tuple[pd.DataFrame, dict, pd.DataFrame]:
    """The trace's rows; its facts with `in_time`: whether its all-gathers came in time, in words
    (in_time.py) and `phases`: where its steps and phases came from (trace/phase_markers.py); its
    all-gathers' rows (gather_rows.py)."""
    ranks = trace.ranks[["rank", "part", "pid"]].drop_duplicates("rank")
    where = rows[["rank", "issue_ns", "phase"]].merge(ranks, on="rank", how="left")
    phases = phase_labels(trace, where, patterns)
    gathers = gather_rows(trace, rows, phases)
    rows = rows.assign(host_scope=stats.host_scopes(trace, rows, int(facts.get("world_size") or len(trace.ranks))))
    facts = {**facts, "phases": phases_of(trace), "in_time": in_time_sentences(gathers)}
    return rows, facts, gathers.assign(path=trace.path)
