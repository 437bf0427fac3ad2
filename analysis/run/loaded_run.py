"""A run loaded: its files read into one Trace, checked to be one run, put on one clock, and measured
once into `LoadedRun`, the object every feature and every view takes.

`load_trace(paths)` reads a run's file(s) (trace/readers/read.py), refuses files that are not ranks of
one run (run_files.check_one_run: two implementations, world sizes, run ids or step counts, ddp.meta
in one only, captures far apart in time, the same rank twice), decides once which GPU work is
communication (measure/phases.communication_mask: gpu_ops.is_comm is what every measure and view reads)
and puts every file on the first file's clock (clocks.align_on_collectives). `measure_run(trace)`
measures it once: its step ranges and every rank's activity (activity.rank_work: the metrics, the
collectives' exposed time and the timeline's overlap strip all draw from it). What only some commands
need is measured the first time one asks, still once per run: the collective calls (the collectives
view, advise and the baseline gate) and each step's backward span (the report's timelines and charts).
Nothing is kept anywhere but on the object, so what it measured goes when the run does.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path

import pandas as pd

from analysis.cache.loads import cached_load
from analysis.cache.unpacked import unpacked
from analysis.errors import TraceError
from analysis.measure.activity import RankWork, rank_work
from analysis.measure.collective_calls import Calls, find_calls
from analysis.measure.phases import communication_mask, find_steps
from analysis.measure.rank_spans import backward_spans
from analysis.run.clocks import align_on_collectives
from analysis.run.run_files import FileIdentity as FileIdentity, check_one_run, file_identity  # re-exported
from analysis.trace.frames import CLOCK_OFFSET_KEY, Trace
from analysis.trace.patterns import Patterns
from analysis.trace.readers.read import StartedRead, read_trace


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
        return find_calls(self.trace, self.patterns, self.works, self.step_ranges)

    @cached_property
    def backward_spans(self) -> pd.DataFrame:
        """rank, step, start_ns, end_ns of each step's backward pass (measure/rank_spans.py), measured on first use."""
        return backward_spans(self.trace, self.patterns, self.step_ranges)

    @property
    def step_starts(self) -> pd.DataFrame:
        """rank, step, start_ns of every step range (the x origin of the report's per-call chart)."""
        ranks = self.trace.ranks[["rank", "part", "pid"]].drop_duplicates(["part", "pid"])
        found = self.step_ranges.merge(ranks, on=["part", "pid"])
        return found[["rank", "step", "start"]].rename(columns={"start": "start_ns"})


def measure_run(trace: Trace, patterns: Patterns | None = None) -> LoadedRun:
    """The loaded trace measured once: its step ranges and every rank's activity."""
    patterns = patterns or Patterns()
    steps = find_steps(trace.nvtx, patterns)  # once: the activity, the calls and the spans are windowed by them
    return LoadedRun(trace, patterns, steps, rank_work(trace, patterns, steps))


def load_run(
    paths: str | Path | Iterable[str | Path],
    patterns: Patterns | None = None,
    *,
    cache: bool | None = None,
    started: StartedRead | None = None,
) -> LoadedRun:
    """The run's files loaded (load_trace) and measured once (measure_run)."""
    return measure_run(load_trace(paths, patterns, cache=cache, started=started), patterns)


def trace_identities(trace: Trace, paths: Sequence[str | Path], patterns: Patterns | None = None) -> list[FileIdentity]:
    """Each part's identity, from the loaded trace's ddp.meta, step ranges and recorded clock (part i is paths[i])."""
    steps = find_steps(trace.nvtx, patterns or Patterns())
    by_part = steps.groupby("part").indices if len(steps) else {}
    return [
        file_identity(
            p,
            (m for (part, _), m in trace.meta.items() if part == i),
            steps.iloc[by_part[i]] if i in by_part else None,
            int(trace.info.get(i, {}).get(CLOCK_OFFSET_KEY, 0) or 0),
        )
        for i, p in enumerate(paths)
    ]


def load_trace(
    paths: str | Path | Iterable[str | Path],
    patterns: Patterns | None = None,
    *,
    cache: bool | None = None,
    started: StartedRead | None = None,
) -> Trace:
    """Load one file, or several one-rank files of one run on the first file's clock (check_one_run
    refuses files of different runs), with gpu_ops.is_comm set by `patterns`; from the load cache
    beside the first file when it holds this load (cache/loads.py; cache=False: neither read nor
    written, None: on unless ANALYSIS_NO_CACHE is set). `started`: the first file's read, started
    already (trace/readers/read.py), which the read takes; the caller closes it."""
    files = [Path(paths)] if isinstance(paths, (str, Path)) else [Path(p) for p in paths]
    patterns = patterns or Patterns()
    if not files:
        raise TraceError("no trace path given")
    return cached_load(files, patterns, lambda: _load(files, patterns, cache, started), cache)


def _load(files: list[Path], patterns: Patterns, cache: bool | None, started: StartedRead | None) -> Trace:
    trace = _read(files, patterns, cache, started)
    check_one_run(trace_identities(trace, files, patterns))
    trace.gpu_ops["is_comm"] = communication_mask(trace.gpu_ops, trace.nvtx, patterns)  # a frame of our own
    return align_on_collectives(trace, patterns)  # the calls it checks the clocks with need is_comm


def _read(files: list[Path], patterns: Patterns, cache: bool | None, started: StartedRead | None) -> Trace:
    """read_trace of the files, a compressed export read from its decompressed copy (cache/unpacked.py);
    the trace and its errors name the files as given."""
    with unpacked(files, cache) as readable:
        if readable == files:
            return read_trace(files, patterns, started=started)
        try:
            trace = read_trace(readable, patterns)
        except TraceError as e:
            message = str(e)
            for given, read in zip(files, readable, strict=True):
                message = message.replace(str(read), str(given))
            raise TraceError(message) from None
    return replace(trace, path=", ".join(str(p) for p in files))
