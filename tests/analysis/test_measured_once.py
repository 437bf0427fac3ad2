"""Every command reads each run once and measures it once, and no view measures again: per command, the
number of times each load and each per-run measure ran, counted by the profiler (no function patched),
against the number of runs the command was given."""

from __future__ import annotations

import cProfile
import pstats
from collections.abc import Callable

import pytest

from analysis.advise import command as advise_cli
from analysis.collectives import command as collectives
from analysis.measure import activity, collective_calls, rank_spans
from analysis.overlap import command as overlap
from analysis.report import command as report
from analysis.run import loaded_run
from analysis.timeline import command as timeline, lanes
from tests.analysis.timeline.test_timeline_traces import write_trace

# what each count names: the one load, and the per-run measures the views draw from
COUNTED = {
    "load_trace": loaded_run.load_trace,
    "measure_run": loaded_run.measure_run,
    "rank_work": activity.rank_work,
    "find_calls": collective_calls.find_calls,
    "backward_spans": rank_spans.backward_spans,
    "run_segments": lanes.run_segments,
}


def counts(command: Callable[[], object]) -> dict[str, int]:
    """How many times each COUNTED function ran while `command` ran."""
    profile = cProfile.Profile()
    profile.runcall(command)
    stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    by_code = {(f, line, name): calls for (f, line, name), (_, calls, *_) in stats.items()}
    out = {}
    for label, fn in COUNTED.items():
        code = fn.__code__
        out[label] = by_code.get((code.co_filename, code.co_firstlineno, code.co_name), 0)
    return out


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    folder = tmp_path_factory.mktemp("once")
    return [str(write_trace(folder / f"{k}.sqlite", k, steps=4)) for k in ("naive", "overlap")]


def test_the_counter_sees_a_measure_run_twice(traces):
    from analysis.run.loaded_run import load_trace

    def twice():
        trace = load_trace(traces[0])
        activity.rank_work(trace)
        activity.rank_work(trace)

    assert counts(twice)["rank_work"] == 2 and counts(twice)["load_trace"] == 1


def test_each_table_command_loads_and_measures_each_run_once(traces, capsys):
    runs = len(traces)
    tables = {**dict.fromkeys(COUNTED, runs), "backward_spans": 0, "run_segments": 0}  # nothing drawn
    assert counts(lambda: overlap.main([*traces, "--format", "json"])) == tables  # its comm split needs the calls
    assert counts(lambda: collectives.main([*traces, "--format", "json"])) == tables
    capsys.readouterr()


@pytest.mark.pages  # writes the timeline page
def test_the_timeline_draws_each_run_from_its_one_load(traces, tmp_path, capsys):
    runs = len(traces)
    got = counts(lambda: timeline.main([*traces, "-o", str(tmp_path / "t.html")]))
    assert got == dict.fromkeys(COUNTED, runs)  # the metrics' calls, the strip's activity, spans, segments: once
    capsys.readouterr()


@pytest.mark.pages  # writes a whole report, its timeline pages too
def test_the_report_draws_each_run_three_times_from_its_one_load(traces, tmp_path, capsys):
    """Timeline page, side-by-side panel and Collectives charts of each run: one load, one of each measure."""
    runs = len(traces)
    got = counts(lambda: report.main([*traces, "-o", str(tmp_path / "r")]))
    assert got == dict.fromkeys(COUNTED, runs)
    capsys.readouterr()


def test_the_baseline_gate_opens_both_runs_through_open_runs_once_each(traces, capsys):
    got = counts(lambda: report.main([traces[1], "--baseline", traces[0], "--format", "json"]))
    assert got == {**dict.fromkeys(COUNTED, 2), "backward_spans": 0, "run_segments": 0}
    capsys.readouterr()


@pytest.mark.real
def test_advise_loads_and_measures_the_run_once(gpu_h200_trace, capsys):
    path = str(gpu_h200_trace("torch.sqlite"))
    got = counts(lambda: advise_cli.main([path, "--format", "json"]))
    assert got == {**dict.fromkeys(COUNTED, 1), "backward_spans": 0, "run_segments": 0}
    capsys.readouterr()
