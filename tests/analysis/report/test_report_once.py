"""A report computes each per-trace measure once: a run's activity, its backward spans and its timeline
segments serve the analysis, its timeline page, its side-by-side panel and its Collectives charts."""

from __future__ import annotations

from collections import Counter

import pandas as pd

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


def test_the_report_command_measures_no_op_phase_split_nor_steps_across_ranks(tmp_path, monkeypatch):
    """What only the overlap command shows (each run's by_op_phase and across_ranks) is not measured by the
    report's command, whose pages show neither; a library OpenRuns still measures both, and the figures the
    report does show are the same either way."""
    from analysis import session
    from analysis.overlap import analyze
    from analysis.report import command as report

    traces = [write_trace(tmp_path / f"{k}.sqlite", k) for k in ("naive", "overlap")]
    calls: Counter = Counter()

    def counted(name, real):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return real(*args, **kwargs)

        return wrapper

    for module, name in ((analyze, "by_op_phase"), (session, "run_across_ranks")):
        monkeypatch.setattr(module, name, counted(name, getattr(module, name)))
    assert report.main([*map(str, traces), "-o", str(tmp_path / "report"), "--format", "json"]) == 0
    assert calls == Counter()  # neither measured for the report
    full = open_runs(traces).results()
    assert calls == {"by_op_phase": len(traces), "run_across_ranks": len(traces)}
    lean = open_runs(traces, overlap_detail=False).results()
    for a, b in zip(full, lean, strict=True):
        assert len(a.analysis.by_op_phase) and b.analysis.by_op_phase.empty and b.across_ranks.empty
        for name in ("steps", "totals", "summary", "by_group"):
            pd.testing.assert_frame_equal(getattr(a.analysis, name), getattr(b.analysis, name))
