"""Read nsys SQLite exports and torch.profiler traces, and measure how much gradient communication
overlapped compute, per rank and step.

The package follows the data: `readers/` (one module per trace format) -> `frames/` (the typed
`Trace` both readers produce, the name patterns) -> `measures/` (interval algebra, steps, overlap
metrics, collective calls) -> `views/` (tables, timelines, HTML pages); `engine/` is the API on top
(`load_trace`, `analyze`, analyses over many files); the CLIs on top are `overlap`, `timeline`, `report`, `collectives`
(`python -m analysis.<name>`).

    from analysis import analyze, load_trace
    result = analyze(["traces/overlap.sqlite"])          # .steps, .totals, .summary DataFrames

Recording (`ddp/`, `profiling/`) never imports this package, so it may load pandas at once.
"""

from analysis.engine.analyze import Analysis, analyze, analyze_trace
from analysis.engine.collectives_view import CollectivesView, analyze_collectives, collectives_of
from analysis.engine.runs import load_trace
from analysis.errors import TraceError
from analysis.frames.patterns import Patterns
from analysis.frames.trace import Trace
from analysis.measures.activity import rank_work
from analysis.measures.metrics import measure_trace

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
