"""Read nsys SQLite exports and torch.profiler traces, and measure how much gradient communication
overlapped compute, per rank and step.

The package follows the data: `readers/` (one module per trace format) -> `frames/` (the typed
`Trace` both readers produce, the name patterns) -> `measures/` (interval algebra, steps, overlap
metrics, collective calls) -> `views/` (tables, timelines, HTML pages); `engine/` is the API on top
(`load_trace`, `analyze`, analyses over many files); the CLIs on top are `overlap`, `timeline`, `report`, `collectives`
(`python -m analysis.<name>`).

    from analysis import analyze, load_trace
    result = analyze(["traces/overlap.sqlite"])          # .steps, .totals, .summary DataFrames

Names are imported on first use, so `python -m analysis.overlap --help` loads no more than it needs.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

_WHERE = {
    "load_trace": "analysis.engine.runs",
    "Trace": "analysis.frames.trace",
    "Patterns": "analysis.frames.patterns",
    "TraceError": "analysis.errors",
    "analyze": "analysis.engine.analyze",
    "analyze_trace": "analysis.engine.analyze",
    "Analysis": "analysis.engine.analyze",
    "analyze_collectives": "analysis.engine.collectives_view",
    "collectives_of": "analysis.engine.collectives_view",
    "CollectivesView": "analysis.engine.collectives_view",
    "measure_trace": "analysis.measures.metrics",
    "rank_work": "analysis.measures.activity",
}
__all__ = [
    "Analysis",
    "CollectivesView",
    "Patterns",
    "Trace",
    "TraceError",
    "analyze",
    "analyze_collectives",
    "analyze_trace",
    "collectives_of",
    "load_trace",
    "measure_trace",
    "rank_work",
]

if TYPE_CHECKING:
    from analysis.engine.analyze import Analysis, analyze, analyze_trace
    from analysis.engine.collectives_view import CollectivesView, analyze_collectives, collectives_of
    from analysis.engine.runs import load_trace
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
