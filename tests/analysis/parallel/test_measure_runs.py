"""measure_runs, the one interface over serial, --jobs and Dask: serially each run is loaded once through
the caller's `load` (the LoadedRun the views then reuse) and a failed run fails alone; file by file in
processes it gives the serial RunResults."""

from __future__ import annotations

from collections.abc import Callable

import pandas as pd
import pytest

from analysis.errors import TraceError
from analysis.measure.loaded_run import LoadedRun, measure_run
from analysis.parallel.measure_runs import measure_runs
from analysis.run.run_files import RunFiles, find_runs
from analysis.run.runs import load_trace
from analysis.trace.patterns import Patterns
from tests.support.synthetic_ddp import write_rank_files

T0 = 1_779_782_330_000_000_000


@pytest.fixture(scope="module")
def rank_files(tmp_path_factory):
    """run.rank<N>.sqlite of a 2-rank run whose captures started 5 ms apart."""
    folder = tmp_path_factory.mktemp("ranks")
    return write_rank_files(folder, "run", [2_000, 2_000], n_steps=3, t0=T0, shifts_ns=[0, 5_000_000])


def loader(runs: list[RunFiles], calls: list[int]) -> Callable[[int], LoadedRun]:
    """runs[i] loaded and measured as OpenRuns.loaded does, each call recorded in `calls`."""

    def load(i: int) -> LoadedRun:
        calls.append(i)
        if not runs[i].paths[0].exists():
            raise TraceError(f"{runs[i].paths[0]}: no such file")
        return measure_run(load_trace(runs[i].paths), Patterns())

    return load


def test_serial_loads_each_run_once_through_load_and_a_bad_run_fails_alone(rank_files, tmp_path):
    runs = [*find_runs(rank_files), *find_runs([tmp_path / "gone.sqlite"], merge=True)]
    calls: list[int] = []
    results = measure_runs(runs, loader(runs, calls), Patterns())
    assert calls == [0, 1]  # one load per run, in order, and no per-file task
    good, bad = results
    assert good.analysis is not None and good.error is None and good.call_rows is not None
    assert sorted(good.analysis.steps["rank"].unique()) == [0, 1]
    # a step is as slow as its slowest rank: across_ranks from the steps measured here
    slowest = good.analysis.steps.groupby("step")["step_ms"].max()
    assert good.across_ranks.set_index("step")["step_ms"].to_numpy() == pytest.approx(slowest.to_numpy())
    assert bad.analysis is None and bad.error == f"{tmp_path / 'gone.sqlite'}: no such file"
    assert bad.failed == runs[1].paths


@pytest.mark.pool  # starts a process pool
def test_jobs_2_gives_the_serial_results(rank_files):
    runs = find_runs(rank_files)
    serial = measure_runs(runs, loader(runs, []), Patterns())
    calls: list[int] = []
    pooled = measure_runs(runs, loader(runs, calls), Patterns(), jobs=2)
    assert calls == []  # file by file: nothing loaded here
    for a, b in zip(serial, pooled, strict=True):
        for name in ("steps", "totals", "summary"):
            pd.testing.assert_frame_equal(getattr(a.analysis, name), getattr(b.analysis, name))
        pd.testing.assert_frame_equal(a.across_ranks, b.across_ranks)
    assert [f.path for f in pooled[0].files] == [str(p) for p in rank_files]
