"""Timing `python -m analysis.overlap` the way the speed benchmarks do (analysis_speed, kineto_speed):
the CLI in a fresh process (wall clock including interpreter start and imports, CPU time and peak RSS
from wait4), its load and metric phases timed in-process, each `repeat` times, the fastest kept. Every
run is a first look: the analysis cache beside the export (analysis/cache/) is off (COLD), or a second
run would print the first's kept answer. The project's bytecode is written first (`compile_project`), as
scripts/setup.sh writes it: a run loads the analysis as a user's does, not compiling it again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
COLD = {**os.environ, "ANALYSIS_NO_CACHE": "1"}  # the environment of every timed run: no cache read or written
PHASES = """
import json, sys, time
t0 = time.perf_counter()
from analysis.overlap.metrics import measure_trace
from analysis.run.loaded_run import load_trace
t1 = time.perf_counter()
trace = load_trace(sys.argv[1:])
t2 = time.perf_counter()
measure_trace(trace)
t3 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "load_s": t2 - t1, "metrics_s": t3 - t2,
                  "rows": {"gpu_ops": len(trace.gpu_ops), "nvtx": len(trace.nvtx)}}))
"""


def compile_project() -> None:
    """Write the bytecode of the project's packages, as scripts/setup.sh does. Where Python writes none
    itself (PYTHONDONTWRITEBYTECODE, set on this project's machines) a timed command would otherwise
    compile every analysis module it imports, about 0.1 s of each run, which a user's runs do not."""
    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", "analysis", "contract"],
        cwd=REPO,
        check=False,  # a checkout that cannot take it is timed as it is
        stdout=subprocess.DEVNULL,
    )


def cli_run(paths: list[Path]) -> tuple[float, float, float, int]:
    """(wall s, CPU s, peak RSS MB, exit code) of one `python -m analysis.overlap --merge PATHS` process.

    CPU time (user + system) is what the run costs without other processes competing for the cores."""
    started = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "analysis.overlap", "--merge", *map(str, paths), "--format", "json"],
        cwd=REPO,
        env=COLD,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, os.waitstatus_to_exitcode(status)


def phase_run(paths: list[Path]) -> dict:
    """import_s, load_s, metrics_s and row counts of loading and measuring `paths` in a fresh process."""
    out = subprocess.run(
        [sys.executable, "-c", PHASES, *map(str, paths)],
        cwd=REPO,
        env=COLD,
        capture_output=True,
        text=True,
        check=True,
        timeout=900,
    )
    return json.loads(out.stdout)


def timed_runs(paths: list[Path], repeat: int, label: str, say: Callable[[str], None]) -> tuple[dict, list[dict]]:
    """(the fastest run, every run): each run's wall_s, cpu_s, peak_rss_mb and phase figures."""
    compile_project()
    runs = []
    for i in range(repeat):
        say(f"analysing {label} (run {i + 1}/{repeat})")
        wall, cpu, rss, code = cli_run(paths)
        if code != 0:
            raise SystemExit(f"analysis.overlap failed on {label} (exit {code})")
        runs.append({"wall_s": wall, "cpu_s": cpu, "peak_rss_mb": rss, **phase_run(paths)})
    best = min(runs, key=lambda r: r["wall_s"])  # the machine is shared: the fastest run is the least disturbed
    return best, runs
