"""One nsys session's file handling: outputs appear complete or not at all (stand-in nsys, no torch)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from contract.nsys_cli import is_complete_sqlite
from profiling.nsys import NsysError
from profiling.processes import run_forwarding_output
from profiling.session import (
    RESULT_PREFIX,
    NsysOptions,
    Recorded,
    parse_result,
    profile_command,
    record,
    result_line,
)
from tests.profiling.test_nsys import REPO, fake_nsys

OK = [sys.executable, "-c", "print('training output')"]
FAIL = [sys.executable, "-c", "import sys; sys.exit(3)"]


def test_options_validate_and_name_the_bad_trace():
    with pytest.raises(ValueError, match="cudaa"):
        NsysOptions(trace="cudaa,nvtx")
    with pytest.raises(ValueError, match="empty"):
        NsysOptions(trace="")


def test_cpu_and_gpu_profile_arguments():
    cpu = NsysOptions().profile_args()
    assert cpu[cpu.index("--trace") + 1] == "nvtx"
    assert cpu[cpu.index("--sample") + 1] == "none" and cpu[cpu.index("--cpuctxsw") + 1] == "none"
    assert cpu[cpu.index("--capture-range") + 1] == "nvtx"
    assert cpu[cpu.index("--nvtx-capture") + 1] == "profile"
    assert cpu[cpu.index("--capture-range-end") + 1] == "stop"
    assert "--cuda-memory-usage" not in cpu
    gpu = NsysOptions(trace="cuda,nvtx,osrt", sample=True).profile_args()
    assert gpu[gpu.index("--sample") + 1] == "process-tree"
    assert "--cuda-memory-usage" in gpu
    cmd = profile_command(Path("/x/nsys"), NsysOptions(), Path("out.nsys-rep"), ["prog", "--a"])
    assert cmd[0] == "/x/nsys" and cmd[-4:] == ["--output", "out.nsys-rep", "prog", "--a"]


def test_record_writes_both_files_and_replaces_only_its_own(tmp_path, capfd):
    nsys = fake_nsys(tmp_path)
    out = tmp_path / "traces"
    out.mkdir()
    (out / "overlap.sqlite").write_text("old")
    (out / "naive.sqlite").write_text("someone else's")
    done = record(nsys, NsysOptions(), OK, out / "overlap")
    assert done.report == out / "overlap.nsys-rep" and done.report.read_text() == "fake report"
    assert is_complete_sqlite(done.sqlite)
    assert (out / "naive.sqlite").read_text() == "someone else's"
    assert sorted(p.name for p in out.iterdir()) == ["naive.sqlite", "overlap.nsys-rep", "overlap.sqlite"]
    err = capfd.readouterr().err
    assert "training output" in err  # the run's own output is passed on ...
    assert "Capture range" not in err and "[1/1]" not in err  # ... nsys's chatter is not


@pytest.mark.parametrize(
    "program, env, message",
    [
        (FAIL, {}, "the profiled run failed \\(exit 3\\)"),
        (OK, {"FAKE_NSYS_NO_REPORT": "1"}, "never opened the NVTX range 'profile'"),
        (OK, {"FAKE_NSYS_EXPORT_FAIL": "1"}, "nsys export .* failed"),
    ],
)
def test_failures_keep_previous_outputs_and_leave_no_partial_files(tmp_path, monkeypatch, program, env, message):
    nsys = fake_nsys(tmp_path)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    out = tmp_path / "traces"
    out.mkdir()
    (out / "overlap.nsys-rep").write_text("previous report")
    (out / "overlap.sqlite").write_text("previous export")
    with pytest.raises(NsysError, match=message):
        record(nsys, NsysOptions(), program, out / "overlap")
    assert (out / "overlap.nsys-rep").read_text() == "previous report"
    assert (out / "overlap.sqlite").read_text() == "previous export"
    assert sorted(p.name for p in out.iterdir()) == ["overlap.nsys-rep", "overlap.sqlite"]


@pytest.mark.subprocess  # waits on a process group: timeouts, retries, signals
@pytest.mark.parametrize("failure", ["sem_open", "eof"])
def test_nsys_start_failure_is_retried(tmp_path, monkeypatch, capfd, failure):
    nsys = fake_nsys(tmp_path)
    monkeypatch.setenv("FAKE_NSYS_START_FAILS_ONCE", str(tmp_path / "failed-once"))
    monkeypatch.setenv("FAKE_NSYS_START_FAILURE", failure)
    done = record(nsys, NsysOptions(), OK, tmp_path / "run")
    assert done.report.is_file() and (tmp_path / "failed-once").is_file()
    assert "trying again (2/3)" in capfd.readouterr().err
    # a failure of the program itself is not retried
    with pytest.raises(NsysError, match="exit 3"):
        record(nsys, NsysOptions(), FAIL, tmp_path / "run2")
    assert "trying again" not in capfd.readouterr().err


@pytest.mark.subprocess  # waits on a process group: timeouts, retries, signals
def test_timeout_kills_the_whole_run(tmp_path):
    nsys = fake_nsys(tmp_path)
    sleeper = [sys.executable, "-c", "import time; print('started', flush=True); time.sleep(60)"]
    with pytest.raises(NsysError, match="longer than 1 s"):
        record(nsys, NsysOptions(), sleeper, tmp_path / "slow", timeout_s=1)
    assert list(tmp_path.glob("*slow*")) == []


@pytest.mark.subprocess  # subprocesses
def test_per_rank_entry_needs_rank_and_names_the_file_after_it(tmp_path):
    nsys = fake_nsys(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "RANK"}
    env["NSYS"] = str(nsys)
    cmd = [sys.executable, "-m", "profiling.session", "--stem", str(tmp_path / "x.rank{rank}"), "--", *OK]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, timeout=60)
    assert res.returncode == 2 and "RANK is not set" in res.stderr and "Traceback" not in res.stderr
    res = subprocess.run(cmd, capture_output=True, text=True, env={**env, "RANK": "3"}, cwd=REPO, timeout=60)
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "x.rank3.nsys-rep").is_file() and is_complete_sqlite(tmp_path / "x.rank3.sqlite")
    assert str(tmp_path / "x.rank3.sqlite") in res.stdout


@pytest.mark.subprocess  # waits on a process group: timeouts, retries, signals
def test_sigterm_stops_run_nsys_and_its_whole_run_without_leftovers(tmp_path):
    nsys = fake_nsys(tmp_path)
    pidfile, out = tmp_path / "nsys.pid", tmp_path / "traces"
    env = {**os.environ, "NSYS": str(nsys), "FAKE_NSYS_HANG_PIDFILE": str(pidfile)}
    proc = subprocess.Popen(
        ["bash", str(REPO / "run_nsys.sh"), "naive", "--gpus", "0", "-o", str(out)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not pidfile.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert pidfile.exists(), "the stand-in nsys never started"
    time.sleep(0.2)
    proc.terminate()
    _, err = proc.communicate(timeout=30)
    assert proc.returncode != 0 and "Traceback" not in err
    with pytest.raises(ProcessLookupError):
        os.kill(int(pidfile.read_text()), 0)  # the hung nsys was stopped with it
    assert list(out.iterdir()) == []  # its partial report was removed


def test_a_sessions_result_line_says_what_its_number_is_and_reads_back():
    done = Recorded(Path("t/x.rank1.nsys-rep"), Path("t/x.rank1.sqlite"), 7.4691)
    line = result_line(done)
    assert line == "[profiling.session] wrote t/x.rank1.nsys-rep\tt/x.rank1.sqlite\tin 7.469 s"
    back = parse_result(line[len(RESULT_PREFIX) :])
    assert (back.report, back.sqlite, back.wall_s) == (done.report, done.sqlite, 7.469)


def test_kinetos_start_stop_markers_are_dropped_and_the_rest_passed_on(capfd):
    marker = "USDT:2026-11-26 09:52:28 {0}:{0} SyncActivityProfilerHandler.cpp:{1}] profiler_{2}"
    lines = [
        marker.format(11, 52, "start"),
        marker.format(11, 59, "stop") + marker.format(12, 59, "stop"),  # two ranks' lines run together
        "WARNING:2026-11-26 09:52:28 11:11 CuptiActivityProfiler.cpp:1] kept",
        "step output " + marker.format(12, 52, "start"),
    ]
    program = [sys.executable, "-c", f"print({chr(10).join(lines)!r})"]
    assert run_forwarding_output(program, dict(os.environ), timeout_s=60) == 0
    assert capfd.readouterr().err.splitlines() == [lines[2], "step output "]


@pytest.mark.subprocess  # waits on a process group
def test_a_process_left_in_the_runs_group_after_it_exits_is_stopped():
    # what an nsys that fails to start leaves: its nsys-launcher, orphaned (parent 1) but still in the run's
    # process group, waiting for good; the run's command here starts such a child and exits at once
    orphan = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)"
    program = [
        sys.executable,
        "-c",
        "import subprocess, sys; quiet = subprocess.DEVNULL; "
        f"p = subprocess.Popen([sys.executable, '-c', {orphan!r}], stdout=quiet, stderr=quiet); print('pid', p.pid)",
    ]
    said: list[str] = []
    assert run_forwarding_output(program, dict(os.environ), timeout_s=60, keep=said, keep_prefix="pid ") == 0
    (pid,) = map(int, said)
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pid}").exists() and "Z" not in Path(f"/proc/{pid}/stat").read_text().split(")")[-1][:3]:
        assert time.monotonic() < deadline, f"process {pid}, left in the run's group, still runs"
        time.sleep(0.1)
