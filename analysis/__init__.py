"""Read nsys SQLite exports and torch.profiler traces, and measure how much gradient communication
overlapped compute, per rank and step.

The package follows the data, on a small core: `trace/` (the trace core: `readers/` turn each
format into the typed frames of `trace.frames.Trace`, the name patterns) -> `measure/` (the measure core:
interval algebra, steps, phases, each rank's activity, collective calls) -> `run/` (which files form a run,
a run loaded once and measured: `LoadedRun`, its clocks) -> one folder per feature, each with its
measures, its view and its command: `overlap/`, `collectives/`, `fsdp_units/` (the FSDP per-unit view),
`timeline/`, `report/` (with its folder's own files and results.db), `advise/`; `parallel/` runs files
as tasks (`--jobs`, `--dask`), `render/` holds the shared drawing primitives and `cache/` what is kept
beside each export (answers, loads). `api.py` is the API on top (`open_runs(paths, options)` ->
session.py's `OpenRuns`, which holds the runs and the AnalysisOptions: runs read once and asked for
overlap, collectives, timelines and the report; `load_trace`); the CLIs are `python -m analysis.<feature>`
(overlap, timeline, report, collectives, advise), each a veneer over `open_runs`. docs/analysis.md#layout
draws it.

    from analysis import open_runs
    runs = open_runs(["traces/overlap.sqlite"])          # read once, asked many times
    runs.overlap().steps                                 # .steps, .totals, .summary DataFrames
    runs.collectives().by_rank                           # the collectives view of the same load
    runs.timeline("reports/t.html", step=3)              # the timeline page, from the same load

Recording (`ddp/`, `profiling/`) never imports this package. Importing it loads nothing more (each name
is imported when first used) and changes nothing in the process: its environment, garbage collector and
allocator stay as they were.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from analysis.api import analyze, analyze_collectives, open_runs
    from analysis.collectives.collectives_view import CollectivesView, collectives_of
    from analysis.errors import TraceError
    from analysis.measure.activity import rank_work
    from analysis.options import AnalysisOptions
    from analysis.overlap.analyze import Analysis, analyze_trace
    from analysis.overlap.metrics import measure_trace
    from analysis.run.loaded_run import LoadedRun, load_run, load_trace
    from analysis.run.run_files import find_runs
    from analysis.session import OpenRuns, TimelinePage
    from analysis.trace.frames import Trace
    from analysis.trace.patterns import Patterns

# Imported when first asked for (PEP 562): `python -m analysis.overlap` imports this package first, and a
# table command answered from its cache (cache/answers.py) must not pay for pandas.
_WHERE = {
    "Analysis": "analysis.overlap.analyze",
    "analyze_trace": "analysis.overlap.analyze",
    "CollectivesView": "analysis.collectives.collectives_view",
    "collectives_of": "analysis.collectives.collectives_view",
    "find_runs": "analysis.run.run_files",
    "load_trace": "analysis.run.loaded_run",
    "load_run": "analysis.run.loaded_run",
    "LoadedRun": "analysis.run.loaded_run",
    "AnalysisOptions": "analysis.options",
    "OpenRuns": "analysis.session",
    "TimelinePage": "analysis.session",
    "analyze": "analysis.api",
    "analyze_collectives": "analysis.api",
    "open_runs": "analysis.api",
    "TraceError": "analysis.errors",
    "Patterns": "analysis.trace.patterns",
    "Trace": "analysis.trace.frames",
    "rank_work": "analysis.measure.activity",
    "measure_trace": "analysis.overlap.metrics",
}


__all__ = [
    "Analysis",
    "AnalysisOptions",
    "CollectivesView",
    "LoadedRun",
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
    "load_run",
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
