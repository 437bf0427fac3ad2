"""Read nsys SQLite exports and torch.profiler traces, and measure how much gradient communication
overlapped compute, per rank and step.

The package follows the data: `readers/` (one module per trace format) -> `frames/` (the typed
`Trace` both readers produce, the name patterns) -> `measures/` (interval algebra, steps, overlap
metrics, collective calls) -> `views/` (tables, timelines, HTML pages); `engine/` is the API on top
(`load_trace`, `analyze`, analyses over many files); the CLIs on top are `overlap`, `timeline`, `report`, `collectives`
(`python -m analysis.<name>`).

    from analysis import open_runs
    runs = open_runs(["traces/overlap.sqlite"])          # read once, asked many times
    runs.overlap().steps                                 # .steps, .totals, .summary DataFrames
    runs.collectives().by_rank                           # the collectives view of the same load

Names are imported on first use, so `python -m analysis.overlap --help` loads no more than it needs.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

_WHERE = {
    "load_trace": "analysis.engine.runs",
    "find_runs": "analysis.engine.runs",
    "Trace": "analysis.frames.trace",
    "Patterns": "analysis.frames.patterns",
    "TraceError": "analysis.errors",
    "analyze": "analysis.engine.session",
    "open_runs": "analysis.engine.session",
    "OpenRuns": "analysis.engine.session",
    "analyze_trace": "analysis.engine.analyze",
    "Analysis": "analysis.engine.analyze",
    "analyze_collectives": "analysis.engine.session",
    "collectives_of": "analysis.engine.collectives_view",
    "CollectivesView": "analysis.engine.collectives_view",
    "measure_trace": "analysis.measures.metrics",
    "rank_work": "analysis.measures.activity",
}
__all__ = [
    "Analysis",
    "CollectivesView",
    "OpenRuns",
    "Patterns",
    "Trace",
    "TraceError",
    "analyze",
    "analyze_collectives",
    "analyze_trace",
    "collectives_of",
    "find_runs",
    "load_trace",
    "measure_trace",
    "open_runs",
    "rank_work",
]

if TYPE_CHECKING:
    from analysis.engine.analyze import Analysis, analyze_trace
    from analysis.engine.collectives_view import CollectivesView, collectives_of
    from analysis.engine.runs import find_runs, load_trace
    from analysis.engine.session import OpenRuns, analyze, analyze_collectives, open_runs
    from analysis.errors import TraceError
    from analysis.frames.patterns import Patterns
    from analysis.frames.trace import Trace
    from analysis.measures.activity import rank_work
    from analysis.measures.metrics import measure_trace


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'analysis' has no attribute {name!r}")
    value = getattr(import_module(_WHERE[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
