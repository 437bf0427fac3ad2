"""A report computes each per-trace measure once: a run's activity, its backward spans and its timeline
segments serve the analysis, its timeline page, its side-by-side panel and its Collectives charts."""

from __future__ import annotations

from collections import Counter

from analysis import open_runs
from analysis.measure import activity, rank_spans
from analysis.timeline import lanes
from tests.analysis.timeline.test_timeline_traces import write_trace


def test_each_per_trace_measure_is_computed_once_per_report(tmp_path, monkeypatch):
    traces = [write_trace(tmp_path / f"{k}.sqlite", k) for k in ("naive", "overlap")]
    calls: Counter = Counter()

    def counted(module, name):
        real = getattr(module, name)

        def wrapper(*args, **kwargs):
            calls[name] += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(module, name, wrapper)

    counted(activity, "step_windows")  # once per rank each time rank_work runs
    counted(rank_spans, "step_at")  # once each time backward_spans runs
    counted(lanes, "gpu_segments")  # once each time a trace's timeline segments are built
    runs = open_runs(traces)
    ranks = sum(len(runs.loaded(i).trace.ranks) for i in range(len(traces)))
    result = runs.report(tmp_path / "report")
    assert result.side_by_side is not None and len(result.timelines) == 2  # both pages drew both traces
    assert calls == {"step_windows": ranks, "step_at": len(traces), "gpu_segments": len(traces)}
