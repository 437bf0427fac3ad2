"""Runs: which input files form one run, and a run loaded ready to measure.

`find_runs(paths, merge)` is the one rule every analysis CLI and the Python API use to turn paths into
runs; `load_trace(paths)` reads a run's file(s) (readers/load.py: either format), puts every file on
the first file's clock (clocks.align_on_collectives) and decides once which GPU work is communication, by
the rule in measures/phases.py (`communication_mask`): gpu_ops.is_comm is what every measure and
view reads.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from analysis.engine.clocks import align_on_collectives
from analysis.frames.patterns import Patterns
from analysis.frames.trace import Trace
from analysis.measures.phases import communication_mask
from analysis.readers.load import read_trace


def load_trace(paths: str | Path | Iterable[str | Path], patterns: Patterns | None = None) -> Trace:
    """Load one file, or several one-rank files of the same run on the first file's clock, with
    gpu_ops.is_comm set by `patterns`."""
    patterns = patterns or Patterns()
    trace = read_trace(paths, patterns)
    trace.gpu_ops["is_comm"] = communication_mask(trace.gpu_ops, trace.nvtx, patterns)  # a frame of our own
    return align_on_collectives(trace, patterns)  # the calls it checks the clocks with need is_comm
