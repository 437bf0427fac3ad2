"""One run read once and measured once: `LoadedRun`, the object every feature and every view takes.

session.OpenRuns loads each run's files into one `Trace` and measures it here, once: its step ranges
and every rank's activity (activity.rank_work: the metrics, the collectives' exposed time and the
timeline's overlap strip all draw from it). What only some commands need is measured the first time
one asks, still once per run: the collective calls (the collectives view, advise and the baseline
gate) and each step's backward span (the report's timelines and charts); the overlap table never
pays for them. The object is handed down; no view measures the trace again, and nothing is kept
anywhere but on the object, so what it measured goes when the run does.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import pandas as pd

from analysis.measure.activity import RankWork, rank_work
from analysis.measure.backward_span import backward_spans
from analysis.measure.collective_calls import Calls, find_calls
from analysis.measure.phases import find_steps
from analysis.trace.frames import Trace
from analysis.trace.patterns import Patterns


@dataclass(frozen=True, eq=False)
class LoadedRun:
    """A loaded run and what was measured of it: `trace`, the `patterns` it was measured with, its step
    ranges (phases.find_steps: part, pid, step, start, end) and every rank's activity (`works`).
    Results are shared: callers must not modify them (no function of the package modifies its inputs)."""

    trace: Trace
    patterns: Patterns
    step_ranges: pd.DataFrame
    works: list[RankWork]

    @cached_property
    def calls(self) -> Calls:
        """Every collective call per rank (collective_calls.find_calls), measured on first use."""
        return find_calls(self.trace, self.patterns, self.works)

    @cached_property
    def backward_spans(self) -> pd.DataFrame:
        """rank, step, start_ns, end_ns of each step's backward pass (backward_span.py), measured on first use."""
        return backward_spans(self.trace, self.patterns)

    @property
    def step_starts(self) -> pd.DataFrame:
        """rank, step, start_ns of every step range (the x origin of the report's per-call chart)."""
        ranks = self.trace.ranks[["rank", "part", "pid"]].drop_duplicates(["part", "pid"])
        found = self.step_ranges.merge(ranks, on=["part", "pid"])
        return found[["rank", "step", "start"]].rename(columns={"start": "start_ns"})


def measure_run(trace: Trace, patterns: Patterns | None = None) -> LoadedRun:
    """The loaded trace measured once: its step ranges and every rank's activity."""
    patterns = patterns or Patterns()
    return LoadedRun(trace, patterns, find_steps(trace.nvtx, patterns), rank_work(trace, patterns))
