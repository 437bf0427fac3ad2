"""Read nsys SQLite exports and torch.profiler traces, and measure how much gradient communication
overlapped compute, per rank and step.

The package follows the data: `readers/` (one module per trace format) -> `frames/` (the typed
`Trace` both readers produce, the name patterns) -> `measures/` (interval algebra, steps, overlap
metrics, collective calls) -> `views/` (tables, timelines, HTML pages); `engine/` is the API on top
(`open_runs`: runs read once and asked for overlap, collectives and timelines; `load_trace`); the
CLIs on top are `overlap`, `timeline`, `report`, `collectives` (`python -m analysis.<name>`).

    from analysis import open_runs
    runs = open_runs(["traces/overlap.sqlite"])          # read once, asked many times
    runs.overlap().steps                                 # .steps, .totals, .summary DataFrames
    runs.collectives().by_rank                           # the collectives view of the same load
    runs.timeline("reports/t.html", step=3)              # the timeline page, from the same load

Recording (`ddp/`, `profiling/`) never imports this package. Importing it loads nothing more: each name
is imported when first used.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from analysis.engine.analyze import Analysis, analyze_trace
    from analysis.engine.api import analyze, analyze_collectives, open_runs
    from analysis.engine.collectives_view import CollectivesView, collectives_of
    from analysis.engine.runs import find_runs, load_trace
    from analysis.engine.session import OpenRuns, TimelinePage
    from analysis.errors import TraceError
    from analysis.frames.patterns import Patterns
    from analysis.frames.trace import Trace
    from analysis.measures.activity import rank_work
    from analysis.measures.metrics import measure_trace

# Imported when first asked for (PEP 562): `python -m analysis.overlap` imports this package first, and a
# table command answered from its cache (answer_cache.py) must not pay for pandas.
_WHERE = {
    "Analysis": "analysis.engine.analyze",
    "analyze_trace": "analysis.engine.analyze",
    "CollectivesView": "analysis.engine.collectives_view",
    "collectives_of": "analysis.engine.collectives_view",
    "find_runs": "analysis.engine.runs",
    "load_trace": "analysis.engine.runs",
    "OpenRuns": "analysis.engine.session",
    "TimelinePage": "analysis.engine.session",
    "analyze": "analysis.engine.api",
    "analyze_collectives": "analysis.engine.api",
    "open_runs": "analysis.engine.api",
    "TraceError": "analysis.errors",
    "Patterns": "analysis.frames.patterns",
    "Trace": "analysis.frames.trace",
    "rank_work": "analysis.measures.activity",
    "measure_trace": "analysis.measures.metrics",
}


__all__ = [
    "Analysis",
    "CollectivesView",
    "OpenRuns",
    "Patterns",
    "TimelinePage",
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


def __getattr__(name: str) -> Any:
    """The public name `name`, imported from its module on first use."""
    if name not in _WHERE:
        raise AttributeError(f"module 'analysis' has no attribute {name!r}")
    from importlib import import_module

    value = getattr(import_module(_WHERE[name]), name)
    globals()[name] = value
    return value
