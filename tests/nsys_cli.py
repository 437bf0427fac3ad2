"""Running the real nsys CLI from tests. nsys 2022.4 now and then fails to start while another nsys
session runs on the machine (sem_open); such a start is retried, as profiling.session does. And now and
then it leaves the profiled program hung at its end (once in about eight CI runs, a plain DDP job: its
ranks done, the program waiting on a lock while nsys's injected threads sat in their own waits; alone
that run takes 15 s): a run past its time is stopped whole, nsys, its launcher, the program and nsys's
agent (found by the owner token they inherit: tests/support/owned.py), and made again."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from profiling import processes
from profiling.session import START_ATTEMPTS, nsys_failed_to_start
from tests.support import owned


def _run(cmd: list[str], cwd: Path, timeout_s: float) -> subprocess.CompletedProcess | None:
    """The finished run, or None when it ran past timeout_s (then everything it started is stopped)."""
    token = owned.new_token(os.environ.get(owned.OWNER_ENV))
    proc = subprocess.Popen(
        cmd, cwd=cwd, env=owned.env_with(token), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        # Every process of the run, found by its token (nsys's agent and launcher are orphans in sessions of
        # their own), is stopped before the pipes are read to their end: the hung program and nsys's
        # launcher hold them open, and reading first waited on them for good.
        owned.end_all(token, wait_s=0)
        proc.communicate(timeout=30)
        processes.stop_leftovers(set(), proc.pid, grace_s=0)  # the semaphore a stopped nsys leaves
        return None
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def profile(cmd: list[str], cwd: Path, timeout_s: float = 120) -> None:
    """Run an `nsys profile` command line, again after a failed start or a hung run; raise
    CalledProcessError (nsys's output in it) or TimeoutExpired when every attempt failed."""
    for attempt in range(1, START_ATTEMPTS + 1):
        done = _run(cmd, cwd, timeout_s)
        if done is None:
            if attempt == START_ATTEMPTS:
                raise subprocess.TimeoutExpired(cmd, timeout_s)
            continue
        if done.returncode == 0:
            return
        if attempt == START_ATTEMPTS or not nsys_failed_to_start(done.stdout + done.stderr):
            raise subprocess.CalledProcessError(done.returncode, cmd, done.stdout, done.stderr)


def record_program(nsys: str, folder: Path, program: str, trace: str = "nvtx") -> Path:
    """Write `program` to folder/prog.py, profile it on the CPU (`-t trace`, no sampling) and return the
    SQLite export folder/run.sqlite."""
    (folder / "prog.py").write_text(program)
    cmd = [nsys, "profile", "-t", trace, "-s", "none", "--cpuctxsw=none", "-o", "run", "-f", "true"]
    profile([*cmd, sys.executable, "prog.py"], cwd=folder)
    export = [nsys, "export", "--type", "sqlite", "-o", "run.sqlite", "run.nsys-rep"]
    subprocess.run(export, cwd=folder, capture_output=True, timeout=120, check=True)
    return folder / "run.sqlite"
