"""A trace ready to measure: `load_trace(paths) -> Trace`, the entry every CLI and the Python API use.

The file(s) are read (readers/load.py: either format, one job's files merged), then which GPU work is
communication is decided once, by the rule in measures/phases.py (`communication_mask`):
gpu_ops.is_comm is what every measure and view reads.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from analysis.frames.patterns import Patterns
from analysis.frames.trace import Trace
from analysis.measures.phases import communication_mask
from analysis.readers.load import read_trace


def load_trace(paths: str | Path | Iterable[str | Path], patterns: Patterns | None = None) -> Trace:
    """Load one file, or several one-rank files of the same job merged onto the first file's clock,
    with gpu_ops.is_comm set by `patterns`."""
    patterns = patterns or Patterns()
    trace = read_trace(paths, patterns)
    trace.gpu_ops["is_comm"] = communication_mask(trace.gpu_ops, trace.nvtx, patterns)  # a frame of our own
    return trace
