"""Running the real nsys CLI from tests: nsys 2022.4 now and then fails to start while another nsys
session runs on the machine (sem_open); such a start is retried, as profiling.session does."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from profiling.session import START_ATTEMPTS, nsys_failed_to_start


def profile(cmd: list[str], cwd: Path, timeout_s: float = 120) -> None:
    """Run an `nsys profile` command line, retrying a failed start; raise CalledProcessError otherwise."""
    for attempt in range(1, START_ATTEMPTS + 1):
        done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout_s)
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
