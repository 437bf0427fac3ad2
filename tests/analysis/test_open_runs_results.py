"""OpenRuns.results, one interface over serial, --jobs and Dask: serially each run is loaded once by the
object (the LoadedRun the views then reuse) and a failed run fails alone; file by file in processes it
gives the serial RunResults."""

from __future__ import annotations

import pandas as pd
import pytest

from analysis import session
from analysis.options import AnalysisOptions
from analysis.run import loaded_run
from analysis.run.run_files import find_runs
from analysis.session import OpenRuns
from tests.support.synthetic_ddp import write_rank_files

T0 = 1_779_782_330_000_000_000


@pytest.fixture(scope="module")
def rank_files(tmp_path_factory):
    """run.rank<N>.sqlite of a 2-rank run whose captures started 5 ms apart."""
    folder = tmp_path_factory.mktemp("ranks")
    return write_rank_files(folder, "run", [2_000, 2_000], n_steps=3, t0=T0, shifts_ns=[0, 5_000_000])


@pytest.fixture
def loads(monkeypatch) -> list[tuple[str, ...]]:
    """The runs loaded in this process (loaded_run.load_trace calls), in order."""
    calls: list[tuple[str, ...]] = []
    real = loaded_run.load_trace

    def counted(paths, patterns=None, **how):
        calls.append(tuple(str(p) for p in paths))
        return real(paths, patterns, **how)

    monkeypatch.setattr(loaded_run, "load_trace", counted)
    return calls


def test_serial_loads_each_run_once_and_a_bad_run_fails_alone(rank_files, tmp_path, loads, monkeypatch):
    def no_tasks(*args, **kwargs):
        raise AssertionError("a serial run went through parallel/")

    monkeypatch.setattr(session, "analyze_groups", no_tasks)
    runs = [*find_runs(rank_files), *find_runs([tmp_path / "gone.sqlite"], merge=True)]
    opened = OpenRuns(runs, needs_events=True)
    results = opened.results()
    assert loads == [tuple(map(str, rank_files)), (str(tmp_path / "gone.sqlite"),)]  # one load per run, in order
    good, bad = results
    assert good.analysis is not None and good.error is None and good.call_rows is not None
    assert opened.loaded(0) is opened.loaded(0) and len(loads) == 2  # the views reuse the run's load
    assert sorted(good.analysis.steps["rank"].unique()) == [0, 1]
    # a step is as slow as its slowest rank: across_ranks from the steps measured here
    slowest = good.analysis.steps.groupby("step")["step_ms"].max()
    assert good.across_ranks.set_index("step")["step_ms"].to_numpy() == pytest.approx(slowest.to_numpy())
    assert bad.analysis is None and bad.error == f"{tmp_path / 'gone.sqlite'}: no such file"
    assert bad.failed == runs[1].paths


@pytest.mark.pool  # starts a process pool
def test_jobs_2_gives_the_serial_results(rank_files, loads):
    runs = find_runs(rank_files)
    serial = OpenRuns(runs).results()
    loads.clear()
    pooled = OpenRuns(runs, AnalysisOptions(jobs=2)).results()
    assert loads == []  # file by file: nothing loaded here
    for a, b in zip(serial, pooled, strict=True):
        for name in ("steps", "totals", "summary"):
            pd.testing.assert_frame_equal(getattr(a.analysis, name), getattr(b.analysis, name))
        pd.testing.assert_frame_equal(a.across_ranks, b.across_ranks)
    assert [f.path for f in pooled[0].files] == [str(p) for p in rank_files]
