"""One export analysed alone, as a task for a process pool or a Dask worker: `analyze_file(path)`.

A merged run's ranks are independent once their clocks are aligned: every metric is computed from
one rank's own work, so a file's task loads it, runs `analyze_trace`, and returns with the analysis
what `rank_merge.combine` needs to merge it with the run's other files: its ranks, step ranges,
ddp.meta marks and target info, its session clock (TARGET_INFO_SESSION_START_TIME) and its
collective calls cut to what the cross-rank pairing looks at. No events leave the task.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.measure import intervals as iv
from analysis.measure.collective_calls import Calls
from analysis.measure.comm_recognition import CommEvidence, comm_evidence
from analysis.overlap.analyze import Analysis, analyze_run
from analysis.run.clocks import recorded_clocks
from analysis.run.loaded_run import load_run
from analysis.trace.patterns import Patterns


@dataclass(frozen=True)
class FileResult:
    """One export analysed alone. `ranks`: part-free rank table (rank as numbered inside this file,
    pid, device, meta_rank from its `ddp.meta` mark or None); `step_ranges`: pid, step, start, end
    on this file's clock; `clock_offset`: UTC ns minus trace-clock ns at its session start (a
    torch.profiler file's baseTimeNanoseconds); `meta` ({pid: ddp.meta dict}) and `info` (the
    export's target info): what the run's metadata and the shared-GPU flags of the merged run are
    computed from; `calls`: the file's collective calls on its own clock, compute cut to the calls
    (`calls_to_ship`), for the wait/transfer split; `name`: the trace's implementation as the loader
    names the file alone; `comm`: what the run's "no communication recognised" note is written from
    (comm_recognition.merged_evidence of the run's files)."""

    path: str
    analysis: Analysis
    source: str
    profiler: str
    profiler_version: str | None
    implementation: str | None  # from the file's ddp.meta marks, None when they do not say
    ranks: pd.DataFrame
    step_ranges: pd.DataFrame
    clock_offset: int
    meta: dict = field(default_factory=dict)
    info: dict = field(default_factory=dict)
    sha256: str = ""
    calls: Calls | None = None
    name: str = ""
    comm: CommEvidence | None = None


def analyze_file(
    path: str | Path, patterns: Patterns | None = None, *, skip_steps: int = 0, cache: bool | None = None
) -> FileResult:
    """Load and analyse one export (nsys SQLite or torch.profiler JSON); what `combine` needs to
    merge it with the run's other files (`cache`: the load cache's setting, loaded_run.load_trace)."""
    run = load_run(path, patterns, cache=cache)  # once: the calls and the metrics come from it
    trace, calls = run.trace, run.calls
    analysis = analyze_run(run, skip_steps=skip_steps)
    meta_rank = [
        trace.meta.get((int(part), int(pid)), {}).get("rank")
        for part, pid in zip(trace.ranks["part"], trace.ranks["pid"], strict=True)
    ]
    ranks = trace.ranks[["rank", "pid", "device"]].assign(meta_rank=pd.Series(meta_rank, dtype=object))
    steps = run.step_ranges[["pid", "step", "start", "end"]]
    implementation = next((str(m["implementation"]) for m in trace.meta.values() if m.get("implementation")), None)
    offset = recorded_clocks(trace)[0].recorded_offset_ns  # as the reader recorded it: no second read
    return FileResult(
        str(path),
        analysis,
        trace.source,
        trace.profiler,
        trace.profiler_version,
        implementation,
        ranks,
        steps,
        offset,
        {pid: m for (_, pid), m in trace.meta.items()},
        trace.info.get(0, {}),
        calls=calls_to_ship(calls),
        name=trace.implementation,
        comm=comm_evidence(trace, patterns or Patterns()),
    )


TEXT_CALL_COLUMNS = [
    "op",
    "tag",
    "phase",
    "kernel",
    "family",
    "group",
    "group_desc",
    "group_ranks",
]  # few distinct values: shipped as categoricals


def calls_to_ship(calls: Calls) -> Calls:
    """The calls with text columns as categoricals and each rank's compute cut to the union of that
    rank's calls: `call_groups.exposure` only measures compute inside a call, so the cut set gives the
    same figures and stays small (10,000 calls of a 1M-kernel file: 1.7 MB pickled, 2.6 MB as found)."""
    frame = calls.frame.astype(dict.fromkeys(TEXT_CALL_COLUMNS, "category"))
    rows = frame.groupby("rank", sort=False).indices
    none = np.zeros(0, dtype=np.int64)
    compute = {}
    for rank, (s, e) in calls.compute.items():  # one iteration per rank
        mine = rows.get(rank, none)
        spans = iv.union(frame["start_ns"].to_numpy()[mine], frame["end_ns"].to_numpy()[mine])
        near = _overlapping(s, e, *spans)
        compute[rank] = iv.intersect(s[near], e[near], *spans)
    return Calls(frame, calls.source, compute)


def _overlapping(starts: np.ndarray, ends: np.ndarray, span_starts: np.ndarray, span_ends: np.ndarray) -> np.ndarray:
    """Which intervals overlap a canonical set (the calls' spans): the few that `iv.intersect` then
    cuts, instead of sweeping every compute kernel of the file."""
    last = np.searchsorted(span_starts, ends, side="left") - 1  # the last span starting before each end
    return (last >= 0) & (span_ends[np.maximum(last, 0)] > starts) if span_starts.size else np.zeros(len(starts), bool)
