"""`python -m analysis.overlap` end to end: formats, JSON keys, and every kind of bad input."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from analysis.overlap.command import main
from tests.analysis.overlap_fixtures import write_cpu_only, write_two_ranks
from tests.support.progress import without_progress
from tests.support.synthetic import NsysWriter

REPO = Path(__file__).resolve().parents[3]
METRIC_KEYS = {
    "step_ms",
    "backward_ms",
    "compute_ms",
    "comm_ms",
    "overlap_ms",
    "backward_overlap_ms",
    "exposed_comm_ms",
    "overlap_pct",
    "comm_kernels",
    "compute_kernels",
    "comm_copies",
    "comm_ranges",
    "comm_kernel_ms",
    "comm_copy_ms",
    "idle_ms",
    "comm_wait_ms",
    "comm_transfer_ms",
    "exposed_comm_wait_ms",
    "exposed_comm_transfer_ms",
    "by_op_phase",  # rows per collective kind and phase (measure/comm_breakdown.py)
}


def run_main(capsys, *args):
    """The CLI in-process (fast): its exit code (argparse's SystemExit included), stdout and stderr. One
    test below runs the real `python -m analysis.overlap` for what only a process shows."""
    try:
        code = main([str(a) for a in args])
    except SystemExit as stop:
        code = stop.code
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(args, code, out, err)


def run_cli(*args, env=None):
    return subprocess.run(
        [sys.executable, "-m", "analysis.overlap", *map(str, args)],
        cwd=REPO,
        text=True,
        capture_output=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    d = tmp_path_factory.mktemp("exports")
    return write_two_ranks(d / "overlap.sqlite"), write_cpu_only(d / "cpu.sqlite")


def test_json_has_the_agreed_keys(capsys, exports):
    done = run_main(capsys, *exports, "--format", "json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert [t["source"] for t in doc["traces"]] == ["kernels", "ranges"]
    gpu = doc["traces"][0]
    assert {"path", "implementation", "source", "profiler", "ranks", "summary"} <= set(gpu)
    rank = gpu["ranks"][0]
    assert {"rank", "pid", "device", "steps", "total"} <= set(rank)
    assert set(rank["total"]) == METRIC_KEYS and set(rank["steps"][0]) == METRIC_KEYS | {"step"}
    assert METRIC_KEYS - {"by_op_phase"} <= set(gpu["summary"])  # the split is per rank, not summarised
    step1 = next(s for s in rank["steps"] if s["step"] == 1)
    assert rank["rank"] == 0 and step1["overlap_pct"] is None  # no comm in that step -> null
    assert gpu["ranks"][1]["total"]["comm_ms"] == pytest.approx(600e-6)
    assert gpu["notes"] == []  # design notes (trace/run_info.py): none for this implementation


def test_notes_say_when_the_strategy_makes_the_overlap_zero(capsys, tmp_path):
    from tests.analysis.timeline.test_timeline_traces import write_trace

    naive = write_trace(tmp_path / "naive.sqlite", "naive")
    (note,) = json.loads(run_main(capsys, naive, "--format", "json").stdout)["traces"][0]["notes"]
    assert "naive all-reduces each gradient after backward" in note
    assert f"  note: {note}" in run_main(capsys, naive).stdout.splitlines()  # the line under the table


def test_table_shows_one_row_per_rank_and_a_summary(capsys, exports):
    done = run_main(capsys, exports[0], "--per-step")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "overlap %" in lines[0] and "exposed comm ms" in lines[0]
    assert sum(1 for line in lines if line.strip().startswith("fixture")) >= 2 + 3 + 1
    assert any(line.startswith("summary") for line in lines)
    said = next(i for i, line in enumerate(lines) if line.endswith("; profiler nsys 2026.2.1.210"))  # its version
    assert lines[said + 1] == (  # the fixture's second rank marks only its steps and backward
        "  phases: pid 100: our NVTX ranges; pid 200: steps from our NVTX ranges, no forward found, "
        "backward from our NVTX ranges, no optimizer found"
    )
    # nothing on stderr but, on a machine slow enough to take over 3 s, the progress line
    assert all(" files done" in line for line in done.stderr.splitlines())


def test_table_says_which_profiler_recorded_a_kineto_trace(capsys, tmp_path):
    from tests.support.synthetic_kineto import write_kineto_ddp_trace

    paths = write_kineto_ddp_trace(tmp_path / "run", n_kernels=400, n_ranks=2, n_steps=2, comm_per_step=2)
    done = run_main(capsys, *paths, "--merge")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert any(line.endswith("; profiler torch.profiler") for line in lines)  # no torch version recorded
    assert lines[-1].startswith("  note: clocks: rank 1:")  # a merged run says what its clocks were


def test_csv_rows_and_skip_steps(capsys, exports):
    ranks = run_main(capsys, exports[0], "--format", "csv")
    assert ranks.stdout.splitlines()[0].startswith("path,implementation,source,profiler,rank,pid,device,steps")
    assert len(ranks.stdout.splitlines()) == 1 + 2
    steps = run_main(capsys, exports[0], "--format", "csv", "--per-step", "--skip-steps", "1")
    assert len(steps.stdout.splitlines()) == 1 + 1


def test_csv_rows_are_the_tables_per_rank_means_over_kept_steps(capsys, exports):
    """Without --per-step the CSV holds the table's rows: per-rank means over the steps left after
    --skip-steps (not the whole-capture totals, which only the JSON gives)."""
    import csv
    import io

    done = run_main(capsys, exports[0], "--format", "csv", "--skip-steps", "1")
    rows = {int(r["rank"]): r for r in csv.DictReader(io.StringIO(done.stdout))}
    steps = run_main(capsys, exports[0], "--format", "csv", "--per-step", "--skip-steps", "1")
    kept = list(csv.DictReader(io.StringIO(steps.stdout)))
    assert METRIC_KEYS - {"by_op_phase"} <= set(rows[0]) and len(kept) == 1  # the split is JSON only
    one = kept[0]
    assert rows[int(one["rank"])]["steps"] == "1"
    assert float(rows[int(one["rank"])]["step_ms"]) == pytest.approx(float(one["step_ms"]))
    table = run_main(capsys, exports[0], "--skip-steps", "1").stdout
    assert len([line for line in table.splitlines() if line.strip().startswith("fixture")]) == len(rows) + 1


def test_patterns_from_the_command_line(capsys, exports):
    done = run_main(capsys, exports[0], "--format", "json", "--comm-pattern", "^never$", "--step-pattern", "^never$")
    rank = json.loads(done.stdout)["traces"][0]["ranks"][1]
    assert rank["steps"][0]["step"] is None and rank["total"]["comm_kernels"] == 1


def test_merge_refuses_one_file_given_twice(capsys, exports, tmp_path):
    done = run_main(capsys, exports[0], exports[0], "--merge", "--format", "json")
    assert_one_line_error(done, "given twice")


def assert_one_line_error(done, *words):
    assert done.returncode == 2
    assert "Traceback" not in done.stderr and done.stdout == ""
    lines = without_progress(done.stderr).strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    for word in words:
        assert word in lines[0]


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.mark.subprocess  # the real command: its exit status and stderr as a process
def test_missing_path_and_directory(tmp_path):
    assert_one_line_error(run_cli(tmp_path / "nope.sqlite"), "no such file")
    assert_one_line_error(run_cli(tmp_path), "directory")


def test_empty_random_and_foreign_sqlite_files(capsys, tmp_path):
    assert_one_line_error(run_main(capsys, _write(tmp_path / "empty.sqlite", b"")), "empty")
    noise = np.random.default_rng(1).integers(0, 256, 8192, dtype=np.uint8).tobytes()
    assert_one_line_error(run_main(capsys, _write(tmp_path / "noise.sqlite", noise)), "not an SQLite file")
    import sqlite3

    conn = sqlite3.connect(tmp_path / "other.sqlite")
    conn.execute("CREATE TABLE users (id INTEGER, name TEXT)")
    conn.commit(), conn.close()
    assert_one_line_error(run_main(capsys, tmp_path / "other.sqlite"), "not an nsys export")


def test_truncated_and_corrupt_exports(capsys, exports, tmp_path):
    data = exports[0].read_bytes()
    assert_one_line_error(run_main(capsys, _write(tmp_path / "cut.sqlite", data[: len(data) // 2])), "truncated")
    damaged = bytearray(data)
    rng = np.random.default_rng(2)
    for offset in (2 * 4096, 5 * 4096):
        damaged[offset : offset + 3000] = rng.integers(0, 256, 3000, dtype=np.uint8).tobytes()
    assert_one_line_error(run_main(capsys, _write(tmp_path / "bad.sqlite", bytes(damaged))), "corrupt")


def test_export_with_nothing_to_measure(capsys, tmp_path):
    path = NsysWriter(tmp_path / "blank.sqlite", cupti=False).close()
    assert_one_line_error(run_main(capsys, path), "neither GPU kernels nor NVTX ranges")


def test_bad_options(capsys, exports):
    assert_one_line_error(run_main(capsys, exports[0], "--comm-pattern", "(unclosed"), "comm_kernel")
    assert_one_line_error(run_main(capsys, exports[0], "--skip-steps", "-1"), "--skip-steps")


def test_report_instead_of_export_names_the_command(capsys, tmp_path, monkeypatch):
    report = _write(tmp_path / "run.nsys-rep", b"not really a report")
    monkeypatch.setenv("NSYS", "/nonexistent/nsys")
    done = run_main(capsys, report)
    expected = f"nsys export --type sqlite -o {tmp_path / 'run.sqlite'} {report}"
    assert_one_line_error(done, expected)


def test_export_flag_runs_nsys_and_never_overwrites(capsys, exports, tmp_path, monkeypatch):
    fake = tmp_path / "fake_nsys"
    fake.write_text(
        f"#!{sys.executable}\nimport shutil, sys\nargs = sys.argv[1:]\n"
        f"shutil.copy({str(exports[0])!r}, args[args.index('--output') + 1])\n"
    )
    fake.chmod(0o755)
    report = _write(tmp_path / "run.nsys-rep", b"report")
    monkeypatch.setenv("NSYS", str(fake))
    done = run_main(capsys, report, "--export", "--format", "json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["traces"][0]["path"].endswith("run.sqlite")
    again = run_main(capsys, report, "--export")
    assert_one_line_error(again, "already exists")
