"""Many traces at once: process pool and Dask give the serial results in input order, bad files are
named while the others finish, the per-rank merge equals loading the run in one piece."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sqlite3
import sys
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis import analyze, analyze_trace
from analysis.overlap import command as overlap
from analysis.overlap.metrics import SPLIT_METRICS
from analysis.parallel import dask_run, pool
from analysis.parallel.file_task import analyze_file
from analysis.parallel.pool import Progress, default_jobs, run_tasks, task_memory
from analysis.parallel.rank_merge import combine
from analysis.parallel.tasks import Outcome
from analysis.report import command as report, report_folder
from analysis.run.clocks import PartClock, clock_shifts
from analysis.run.loaded_run import load_trace
from tests.support.progress import without_progress
from tests.support.quick import costly_except
from tests.support.synthetic import NsysWriter
from tests.support.synthetic_ddp import write_ddp_trace, write_rank_files

REPO = Path(__file__).resolve().parents[3]
T0 = 1_779_782_330_000_000_000
WORLD = 3


@pytest.fixture(autouse=True)
def time_limit():
    """Fail a test that hangs (a pool or cluster waiting forever) instead of hanging the suite."""

    def expire(signum, frame):
        raise TimeoutError("test ran past its 180 s limit")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(180)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


@pytest.fixture(scope="module")
def rank_files(tmp_path_factory):
    """run.rank<N>.sqlite of a 3-rank run whose captures started 0, 7 and 3 ms apart; rank 0 is the biggest
    so that it finishes last in a pool."""
    folder = tmp_path_factory.mktemp("ranks")
    return write_rank_files(
        folder, "run", [20_000, 2_000, 2_000], n_steps=4, t0=T0, shifts_ns=[0, 7_000_000, 3_000_000]
    )


@pytest.fixture(scope="module")
def per_file(rank_files):
    """analyze_file of each rank file, computed once for the module (the tests only read them)."""
    return [analyze_file(p) for p in rank_files]


@pytest.fixture(scope="module")
def whole_run(rank_files):
    """The run loaded in one piece and its analysis, computed once for the module (the tests only read them)."""
    trace = load_trace(rank_files)
    return trace, analyze_trace(trace)


@pytest.fixture(scope="module")
def noise(tmp_path_factory):
    path = tmp_path_factory.mktemp("bad") / "noise.sqlite"
    path.write_bytes(np.random.default_rng(3).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    return path


def assert_same(a, b):
    for name in ("steps", "totals", "summary"):
        pd.testing.assert_frame_equal(getattr(a, name), getattr(b, name))


def assert_split_paired(analysis):
    """Every rank-step with collectives has its wait/transfer split, which needs every rank's calls:
    one file alone leaves it NaN."""
    steps = analysis.steps[analysis.steps["comm_kernels"] > 0]
    assert len(steps) and steps[SPLIT_METRICS].notna().all().all()
    assert (steps["comm_wait_ms"] > 0).any() and (steps["comm_transfer_ms"] > 0).any()


def cli(capsys, *args) -> tuple[int, str, str]:
    code = overlap.main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


# --- per-rank merge from per-file results -------------------------------------------------------


@pytest.mark.parametrize("skip", costly_except(pytest.mark.pool, [0], [0, 1]))  # the quick loop: without skipped steps
def test_merge_from_per_file_results_equals_loading_the_run_at_once(rank_files, per_file, whole_run, skip):
    whole = whole_run[1] if skip == 0 else analyze_trace(load_trace(rank_files), skip_steps=skip)
    results = per_file if skip == 0 else [analyze_file(p, skip_steps=skip) for p in rank_files]
    merged = combine(rank_files, results)
    assert_same(merged.analysis, whole)  # every column, the wait/transfer split of paired calls included
    assert merged.analysis.steps["rank"].unique().tolist() == [0, 1, 2]
    assert_split_paired(merged.analysis)
    alone = per_file[1].analysis.steps  # one of three ranks: no call is paired
    assert alone.loc[alone["comm_kernels"] > 0, "comm_wait_ms"].isna().all()


def test_each_file_ships_its_compute_only_under_its_calls(rank_files, per_file):
    """A file's result carries its rank's compute only where it lies under the rank's calls (what the
    pairing of a merge reads), not the whole compute of the one-piece load."""
    from analysis.measure.collective_calls import find_calls

    full, shipped = find_calls(load_trace(rank_files[0])).compute[0], per_file[0].calls.compute[0]
    assert 0 < len(shipped[0]) < len(full[0])


def _rankless_file(path: Path, device: int, utc: int, durations: list[int]) -> Path:
    """A one-process export without ddp.meta: ranks come from device order across the merged files."""
    w = NsysWriter(path, session_start_utc_ns=utc)
    starts = np.arange(len(durations)) * 1_000_000 + 100_000
    w.nvtx(500, 500, starts, starts + np.array(durations), np.array([f"step {i}" for i in range(len(durations))]))
    w.kernels(500, 500, device, 7, starts + 1_000, starts + 50_000, "gemm", launch=starts + 500)
    w.kernels(500, 500, device, 9, starts + 2_000, starts + 90_000, "ncclDevKernel_AllReduce", launch=starts + 600)
    return w.close()


def test_merge_numbers_rankless_files_by_device_like_the_loader(tmp_path):
    paths = [
        _rankless_file(tmp_path / "b.sqlite", 1, T0, [400_000, 300_000]),
        _rankless_file(tmp_path / "a.sqlite", 0, T0 + 5_000, [200_000, 600_000]),
        _rankless_file(tmp_path / "c.sqlite", 0, T0 + 1_000, [500_000, 100_000]),
    ]
    merged = combine(paths, [analyze_file(p) for p in paths])
    assert_same(merged.analysis, analyze_trace(load_trace(paths)))
    # device 0 before device 1, then file order: a -> 0, c -> 1, b -> 2
    assert merged.analysis.totals["rank"].tolist() == [0, 1, 2]
    assert merged.analysis.totals["device"].tolist() == [0, 0, 1]


def test_clock_offsets_come_from_session_metadata_and_align_like_the_loader(rank_files, per_file, whole_run):
    offsets = [session_offset(p) for p in rank_files]
    assert [o - offsets[0] for o in offsets] == [0, 7_000_000, 3_000_000]
    assert [r.clock_offset for r in per_file] == offsets  # analyze_file's: the reader's record, read once
    assert clock_shifts([PartClock(o) for o in offsets]) == [0, 7_000_000, 3_000_000]
    whole = whole_run[0]
    firsts = whole.gpu_ops.groupby("part")["start"].min().tolist()
    alone = [int(load_trace(p).gpu_ops["start"].min()) for p in rank_files]
    assert [f - a for f, a in zip(firsts, alone, strict=True)] == [0, 7_000_000, 3_000_000]


def session_offset(path: Path) -> int:
    """UTC minus trace clock at session start, straight from the export's table."""
    with sqlite3.connect(path) as db:
        columns = {row[1] for row in db.execute("PRAGMA table_info(TARGET_INFO_SESSION_START_TIME)")}
        clock = "systemClockNs" if "systemClockNs" in columns else "0"  # older exports: trace clock from 0
        utc, at = db.execute(f"SELECT utcEpochNs, {clock} FROM TARGET_INFO_SESSION_START_TIME").fetchone()
    return int(utc) - int(at)


def _step_ranges(path: Path) -> dict[int, tuple[int, int]]:
    """{step number: (start, end)} of the file's `step N` ranges, straight from the table."""
    with sqlite3.connect(path) as db:
        rows = db.execute("SELECT text, start, \"end\" FROM NVTX_EVENTS WHERE text LIKE 'step %'").fetchall()
    return {int(text.split()[1]): (start, end) for text, start, end in rows}


def test_across_ranks_a_step_is_as_slow_as_its_slowest_rank(rank_files, per_file):
    merged = combine(rank_files, per_file)
    spread, steps = merged.across_ranks, merged.analysis.steps
    shifts = [0, 7_000_000, 3_000_000]
    ranges = [_step_ranges(p) for p in rank_files]
    assert spread["step"].tolist() == [0, 1, 2, 3] and set(spread["ranks"]) == {WORLD}
    for row in spread.itertuples():
        mine = steps[steps["step"] == row.step]
        ms = dict(zip(mine["rank"].tolist(), mine["step_ms"].tolist(), strict=True))
        assert row.step_ms == max(ms.values()) and row.slowest_rank == max(ms, key=ms.get)
        assert row.mean_step_ms == pytest.approx(sum(ms.values()) / WORLD)
        assert row.exposed_comm_ms == mine["exposed_comm_ms"].max()
        # skews from the raw CPU step ranges, each file put on the first file's clock
        starts = [r[row.step][0] + s for r, s in zip(ranges, shifts, strict=True)]
        ends = [r[row.step][1] + s for r, s in zip(ranges, shifts, strict=True)]
        assert row.start_skew_ms == pytest.approx((max(starts) - min(starts)) / 1e6)
        assert row.end_skew_ms == pytest.approx((max(ends) - min(ends)) / 1e6)


# --- process pool ---------------------------------------------------------------------------------


# <run>.rank<N> files of one folder are one run with or without --merge (find_runs gives the same files in
# the same order either way, and merge reaches nothing else): the pool's tests run them without it.


@pytest.mark.pool  # starts a process pool
def test_jobs_2_gives_the_serial_results_in_input_order(rank_files):
    assert_same(analyze(rank_files, jobs=2), analyze(rank_files, jobs=1))


@pytest.mark.pool  # starts a process pool
def test_cli_jobs_2_output_is_byte_identical_and_progress_goes_to_stderr(rank_files, capsys, monkeypatch):
    monkeypatch.setattr(pool, "PROGRESS_AFTER_S", 0.0)
    serial = cli(capsys, *rank_files, "--format", "json", "--jobs", "1")
    pooled = cli(capsys, *rank_files, "--format", "json", "--jobs", "2")
    assert serial[0] == pooled[0] == 0 and serial[1] == pooled[1]
    assert "[overlap] 3/3 files done" in pooled[2] and "files done" not in pooled[1]
    doc = json.loads(pooled[1])
    assert [r["rank"] for r in doc["traces"][0]["ranks"]] == [0, 1, 2]
    assert [s["step"] for s in doc["traces"][0]["steps_across_ranks"]] == [0, 1, 2, 3]


def test_one_bad_file_is_named_and_the_others_finish(rank_files, noise, capsys):
    code, out, err = cli(capsys, rank_files[0], noise, rank_files[1], "--format", "json", "--jobs", "2")
    assert code == 2 and "Traceback" not in err
    # run.rank0 and run.rank1 are one run (<run>.rank<N> files of one folder), with a note on rank 2
    (run,) = json.loads(out)["traces"]
    assert run["path"] == f"{rank_files[0]}, {rank_files[1]}" and run["ranks_note"].startswith("ranks 0, 1 of 3:")
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert errors == [f"error: {noise}: not an SQLite file"]


@pytest.mark.pool  # a process pool (the quick loop keeps one: one bad file in a pool)
def test_several_bad_files_get_a_closing_line_naming_them(rank_files, noise, tmp_path, capsys):
    missing = tmp_path / "missing.sqlite"
    code, out, err = cli(capsys, noise, rank_files[2], missing, "--jobs", "2", "--format", "csv")
    assert code == 2 and "Traceback" not in err and str(rank_files[2]) in out
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert errors == [
        f"error: {noise}: not an SQLite file",
        f"error: {missing}: no such file",
        f"error: 2 of 3 files failed: {noise}, {missing}",
    ]


@pytest.mark.pool  # a process pool (the quick loop keeps one: one bad file in a pool)
def test_a_merged_run_with_a_bad_rank_file_gives_no_result(rank_files, noise, capsys):
    code, out, err = cli(capsys, rank_files[0], noise, "--merge", "--jobs", "2")
    assert (
        code == 2
        and out == ""
        and [line for line in err.splitlines() if not line.startswith("[overlap]")]
        == [f"error: {noise}: not an SQLite file"]
    )


def exit_in_worker(item: int) -> int:
    """A task that kills its worker process for item 1 (an OOM kill looks the same to the pool)."""
    if item == 1:
        os._exit(9)
    return item * 10


def pid_of(item: int) -> tuple[int, int]:
    """(item, the worker's pid), after killing the worker for item 1 as exit_in_worker does."""
    exit_in_worker(item)
    return item, os.getpid()


@pytest.mark.pool  # starts process pools
def test_workers_are_replaced_every_round_and_a_dead_one_fails_its_file_only(monkeypatch):
    """jobs x TASKS_PER_WORKER items per pool: 2 x 1 here, so 7 items take 4 pools of new workers;
    results stay in input order, and a worker killed in a round (retried once, alone, after the
    rounds) costs only its own file."""
    from analysis.parallel import pool

    monkeypatch.setattr(pool, "TASKS_PER_WORKER", 1)
    outcomes = run_tasks(pid_of, list(range(7)), jobs=2)
    assert [o.value and o.value[0] for o in outcomes] == [0, None, 2, 3, 4, 5, 6]
    assert outcomes[1].error == "1: the worker process analysing it died (out of memory? see dmesg)"
    rounds = [{o.value[1] for o in outcomes[i : i + 2] if o.ok} for i in range(0, 7, 2)]
    assert all(a.isdisjoint(b) for k, a in enumerate(rounds) for b in rounds[k + 1 :])  # no worker kept


def test_progress_lines_say_done_total_rate_and_eta():
    lines = []
    progress = Progress(3, "[x]", after_s=0, write=lines.append)
    run_tasks(abs, [-1, -2, -3], jobs=1, progress=progress)
    assert lines[-1].startswith("[x] 3/3 files done, ") and "files/s" in lines[-1] and "ETA 0.0 s" in lines[-1]
    progress = Progress(2, "[x]", after_s=0, write=lines.append)
    progress.tick(Outcome("a", error="a: bad"))
    assert "1/2 files done, 1 failed" in lines[-1] and "ETA" in lines[-1]


def test_default_jobs_are_bounded_by_cores_files_and_memory(rank_files, monkeypatch):
    monkeypatch.setattr(pool, "SMALL_INPUT_BYTES", 0)
    monkeypatch.setattr(pool, "usable_cores", lambda: 16)
    monkeypatch.setattr(pool, "available_memory", lambda: 100 * 2**30)
    assert default_jobs(rank_files) == 3  # one per file
    per_task = task_memory(rank_files)
    monkeypatch.setattr(pool, "available_memory", lambda: int(2.6 * per_task / pool.MEMORY_SHARE))
    assert default_jobs(rank_files) == 2
    monkeypatch.setattr(pool, "available_memory", lambda: 0)
    assert default_jobs(rank_files) == 1
    monkeypatch.setattr(pool, "SMALL_INPUT_BYTES", 64 * 2**20)
    monkeypatch.setattr(pool, "available_memory", lambda: 100 * 2**30)
    assert default_jobs(rank_files) == 1  # a few MB: a pool would cost more than it saves


@pytest.mark.parametrize("jobs", ["0"])
def test_bad_jobs_is_a_one_line_error(rank_files, jobs, capsys):
    code, out, err = cli(capsys, rank_files[1], "--jobs", jobs)
    assert code == 2 and out == ""
    assert err.strip() == f"error: --jobs {jobs}: must be a whole number >= 1"


# --- report: one writer ---------------------------------------------------------------------------


def _db_rows(path: Path) -> dict:
    with sqlite3.connect(path) as db:
        return {t: sorted(db.execute(f"SELECT * FROM {t}").fetchall(), key=repr) for t in ("ranks", "steps")}


@pytest.mark.pool  # starts a process pool
def test_report_with_jobs_writes_the_serial_results_from_one_process(
    rank_files, whole_run, tmp_path, capsys, monkeypatch
):
    writers = []
    real = report_folder.record_history
    monkeypatch.setattr(report_folder, "record_history", lambda *a: writers.append(os.getpid()) or real(*a))
    inputs = [*rank_files, rank_files[0].parent / "single.sqlite"]
    write_ddp_trace(inputs[-1], n_kernels=4_000, n_ranks=2, n_steps=2)
    for jobs in ("1", "2"):
        assert report.main([*map(str, inputs), "-o", str(tmp_path / jobs), "--no-timelines", "--jobs", jobs]) == 0
    assert writers == [os.getpid()] * 2
    assert (tmp_path / "1" / "summary.csv").read_bytes() == (tmp_path / "2" / "summary.csv").read_bytes()
    assert _db_rows(tmp_path / "1" / "results.db") == _db_rows(tmp_path / "2" / "results.db")
    # the per-rank group is one trace whose figures are those of loading it at once
    summary = pd.read_csv(tmp_path / "2" / "summary.csv")
    whole = whole_run[1].summary.iloc[0]
    row = summary[summary["ranks"] == WORLD].iloc[0]
    assert row["step_ms"] == pytest.approx(whole["step_ms"]) and row["steps"] == whole["steps"]


@pytest.mark.pool  # a process pool, then a timeline per trace
def test_report_with_jobs_draws_timelines_from_traces_loaded_again(rank_files, tmp_path, capsys):
    assert report.main([*map(str, rank_files[1:]), "-o", str(tmp_path / "r"), "--jobs", "2"]) == 0
    page = (tmp_path / "r" / "timelines" / "run.html").read_text()
    assert "<title>Timeline: synthetic</title>" in page


@pytest.mark.pool  # a process pool (the quick loop keeps one: one bad file in a pool)
def test_report_with_a_bad_file_names_it_and_writes_nothing(rank_files, noise, tmp_path, capsys):
    code = report.main([str(rank_files[1]), str(noise), "-o", str(tmp_path / "r"), "--jobs", "2"])
    err = capsys.readouterr().err
    assert code == 2
    assert [line for line in err.splitlines() if line.startswith("error")] == [f"error: {noise}: not an SQLite file"]
    assert not (tmp_path / "r").exists()


CHILDREN_AFTER_MAIN = """
import os, sys
from analysis.overlap import command as overlap

def children(pid):
    \"\"\"Live or defunct processes whose parent is pid, and theirs (from /proc: no psutil needed).\"\"\"
    parent = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # not a process, or gone meanwhile
        parent[int(entry)] = int(fields[1])
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        found += kids
        todo += kids
    return found

code = overlap.main(sys.argv[1:])
print(code, children(os.getpid()), file=sys.stderr)
"""


@pytest.mark.pool  # starts a process pool in a subprocess
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")
def test_no_worker_process_outlives_the_command(rank_files, tmp_path):
    """A pool's fork server, resource tracker and workers are gone when main returns, so a caller
    timing the command sees all their CPU and memory."""
    import subprocess
    import sys as _sys

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [_sys.executable, "-c", CHILDREN_AFTER_MAIN, *map(str, rank_files), "--jobs", "2", "--format", "json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=170,
        cwd=tmp_path,
    )
    last = done.stderr.strip().splitlines()[-1]
    assert last == "0 []", done.stderr


# --- Dask -----------------------------------------------------------------------------------------


@pytest.mark.pool  # starts a Dask cluster
def test_dask_local_cluster_gives_the_serial_results(rank_files, noise, dask_cluster, capsys):
    serial = cli(capsys, *rank_files, "--format", "json", "--jobs", "1")  # one run without --merge too
    on_dask = cli(capsys, *rank_files, "--format", "json", "--dask", dask_cluster)
    assert serial[0] == on_dask[0] == 0 and serial[1] == on_dask[1]
    code, out, err = cli(capsys, rank_files[1], noise, "--format", "json", "--dask", dask_cluster)
    assert code == 2 and [t["path"] for t in json.loads(out)["traces"]] == [str(rank_files[1])]
    errors = [line for line in err.splitlines() if line.startswith("error")]
    assert errors == [f"error: {noise.resolve()}: not an SQLite file"]


@pytest.mark.parametrize("missing", ["distributed", "dask"])
@pytest.mark.parametrize("main", [overlap.main, report.main], ids=["overlap", "report"])
def test_dask_without_the_extra_is_one_line_naming_it(rank_files, tmp_path, capsys, monkeypatch, missing, main):
    """--dask with dask or distributed not importable (None in sys.modules makes `import` raise
    ModuleNotFoundError, as when the extra is not installed): one line naming the extra, exit 2, no output."""
    for name in [m for m in list(sys.modules) if m == missing or m.startswith(missing + ".")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, missing, None)
    extra = ["-o", str(tmp_path / "r")] if main is report.main else []
    code = main([*map(str, rank_files), "--dask", "local", *extra])
    out, err = capsys.readouterr()
    lines = [line for line in err.strip().splitlines() if not line.startswith("[")]
    assert code == 2 and out == "" and len(lines) == 1 and "Traceback" not in err, err
    assert lines[0] == f"error: {dask_run.MISSING_EXTRA}" and "pip install 'ddp-overlap[dask]'" in lines[0]
    assert not (tmp_path / "r").exists()


def worker_settings() -> tuple:
    import dask

    return os.environ.get("MALLOC_TRIM_THRESHOLD_"), dask.config.get("distributed.worker.profile.enabled")


@pytest.mark.pool  # starts a Dask cluster
def test_dask_local_workers_run_without_the_fixed_trim_threshold_and_profiler(monkeypatch):
    pytest.importorskip("distributed")
    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_", raising=False)  # a nanny started earlier in this process sets it
    client, cluster = dask_run._dask_client("local", 1)
    try:
        assert list(client.run(worker_settings).values()) == [(None, False)]
    finally:
        client.close()
        cluster.close()


def test_a_local_cluster_serves_http_on_a_free_port_when_8787_is_held(monkeypatch):
    """Two clusters at once (the suite's workers, or a user's own Dask beside --dask local): no warning."""
    pytest.importorskip("distributed")
    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_", raising=False)
    with socket.socket() as held, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with contextlib.suppress(OSError):  # held by someone else already: the same case
            held.bind(("", 8787))
            held.listen()
        client, cluster = dask_run._dask_client("local", 1)
        client.close()
        cluster.close()
    assert not [w for w in caught if "8787" in str(w.message)]


def test_a_fixed_malloc_trim_threshold_is_undone_only_where_set(monkeypatch):
    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_", raising=False)
    assert dask_run.undo_fixed_trim_threshold() is False
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "65536")  # as a Dask nanny starts its workers
    assert dask_run.undo_fixed_trim_threshold() is True


@pytest.mark.pool  # starts a Dask cluster
def test_report_on_dask_writes_the_serial_summary(rank_files, dask_cluster, tmp_path, capsys):
    for name, extra in (("serial", ["--jobs", "1"]), ("dask", ["--dask", dask_cluster])):
        assert report.main([*map(str, rank_files), "-o", str(tmp_path / name), "--no-timelines", *extra]) == 0
    assert (tmp_path / "serial" / "summary.csv").read_bytes() == (tmp_path / "dask" / "summary.csv").read_bytes()


@pytest.mark.pool  # waits for a Dask scheduler that never answers
def test_an_unreachable_scheduler_is_a_one_line_error(rank_files, capsys, monkeypatch):
    pytest.importorskip("distributed")
    monkeypatch.setattr(dask_run, "DASK_CONNECT_TIMEOUT", "1s")
    code, out, err = cli(capsys, rank_files[1], "--dask", "tcp://127.0.0.1:9")
    assert code == 2 and out == "" and err.startswith("error: --dask tcp://127.0.0.1:9: cannot reach")
    assert len(err.strip().splitlines()) == 1


# --- real H100 per-rank traces ----------------------------------------------------------------------


@pytest.mark.real  # reads whole real traces
@pytest.mark.parametrize("run", ["naive", "overlap"])
def test_real_per_rank_traces_merge_from_per_file_results(gpu_trace, run, capsys):
    from tests.gpu_traces import RUN_TIMER_MS

    paths = [gpu_trace(f"{run}.rank{r}.sqlite") for r in (0, 1)]
    results = [analyze_file(p) for p in paths]
    merged = combine(paths, results)
    whole = analyze_trace(load_trace(paths))
    assert_same(merged.analysis, whole)  # every column, the wait/transfer split included
    assert_split_paired(merged.analysis)
    # the two nsys sessions started > 20 ms apart; on the aligned clocks both ranks leave every step
    # within a few ms of each other (its all-reduces synchronise them)
    offsets = [session_offset(p) for p in paths]
    assert abs(offsets[1] - offsets[0]) > 20_000_000
    spread = merged.across_ranks
    assert len(spread) == 5 and (spread["end_skew_ms"] < 5).all()
    # a step is as slow as its slowest rank: the run's own timer agrees within 2 %
    assert spread["step_ms"].mean() == pytest.approx(RUN_TIMER_MS[f"{run}.rank0.sqlite"], rel=0.02)
    assert merged.analysis.totals["shared_gpu"].all()  # both ranks ran on the one H100 (MPS)
    # what the CLIs run (one task per file, in a pool) prints what the serial merge above prints
    serial = cli(capsys, *paths, "--merge", "--format", "json", "--jobs", "1")
    pooled = cli(capsys, *paths, "--merge", "--format", "json", "--jobs", "2")
    assert serial[0] == pooled[0] == 0 and serial[1] == pooled[1]


# --- torch.profiler JSON ----------------------------------------------------------------------------


@pytest.mark.pool  # jobs=2: a process pool
def test_torch_profiler_files_alone_and_merged_from_per_file_results_on_their_clocks(tmp_path, capsys):
    """Kineto files go through the per-file task alone and merged: per-rank files whose captures started
    apart (baseTimeNanoseconds 0, 7 and 3 ms later) merge from per-file results, in this process or a
    pool, exactly as the loader merges them, the wait/transfer split included; files of different jobs
    get the loader's error from the merge."""
    from analysis.errors import TraceError
    from tests.support.synthetic_kineto import BASE_TIME_NS, write_kineto_ddp_trace

    paths = write_kineto_ddp_trace(tmp_path / "k", n_kernels=3_000, n_ranks=3, n_steps=3)
    for path, shift in zip(paths[1:], (7_000_000, 3_000_000), strict=True):  # later capture starts
        text = path.read_text()
        base = f'"baseTimeNanoseconds": {BASE_TIME_NS}'
        assert text.count(base) == 1
        path.write_text(text.replace(base, f'"baseTimeNanoseconds": {BASE_TIME_NS + shift}'))
    results = [analyze_file(p) for p in paths]
    assert [r.clock_offset - BASE_TIME_NS for r in results] == [0, 7_000_000, 3_000_000]
    whole = load_trace(paths)
    merged = combine(paths, results)
    assert_same(merged.analysis, analyze_trace(whole))
    assert_split_paired(merged.analysis)
    assert_same(analyze(paths, merge=True, jobs=2), analyze_trace(whole))  # what the CLIs run
    assert_same(analyze(paths[0], jobs=2), analyze_trace(load_trace(paths[0])))  # one file: no pool needed
    code, out, err = cli(capsys, paths[0], "--format", "json")
    assert code == 0 and without_progress(err) == "" and json.loads(out)["traces"][0]["ranks"][0]["rank"] == 0
    other = write_kineto_ddp_trace(tmp_path / "other", n_kernels=1_000, n_ranks=2, n_steps=1)[1]
    with pytest.raises(TraceError, match="cannot merge files of different runs"):
        combine([paths[0], other], [results[0], analyze_file(other)])


STOP_WITHOUT_A_POOL = """
import gc, sys
from multiprocessing import resource_tracker
from analysis.parallel.pool import stop_helpers

collected = []
gc.collect = lambda *a: collected.append(1) or 0
stop_helpers(tracker=True)  # no pool ran: no tracker to stop, and no collection before it
print(len(collected), resource_tracker._resource_tracker._pid)
"""


def test_helpers_stop_skips_a_tracker_that_never_started(tmp_path):
    """A serial command started no resource tracker: its end neither collects (about 0.03 s with a
    1M-kernel run loaded) nor starts a tracker to stop it."""
    import subprocess

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", STOP_WITHOUT_A_POOL], capture_output=True, text=True, env=env, timeout=60, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["0", "None"]
