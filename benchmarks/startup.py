"""Start-up of the table CLIs and their answer, cold and warm: the wall time of importing each in a fresh
interpreter beside the floor (the interpreter alone, numpy, numpy + pandas), whether a chart library
came with it, and with `--trace FILE` the whole command on that export: cold (no analysis cache: the
first look, which reads the export and writes the cache) and warm (the same command again: its answer
from the cache beside the export, analysis/cache/answers.py).

Each statement runs `--repeat` times in a fresh process, the statements interleaved so that load
from other processes falls on all alike; the fastest run of each is printed (the machine is shared:
the fastest is the least disturbed) with its CPU time (user + sys of the child) and the load average.
`ours` is a CLI's import time less the bare interpreter's. The trace is copied into a temporary folder
first, so that no cache is written beside the file given. The project's bytecode is written before
(benchmarks/cli_timing.compile_project), as scripts/setup.sh does.

    python benchmarks/startup.py                  # best of 5
    python benchmarks/startup.py --trace /tmp/gpu_h100/overlap.sqlite --repeat 5
    python benchmarks/startup.py --repeat 9 --format json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cli_timing import compile_project  # a sibling module: run as python benchmarks/startup.py

REPO = Path(__file__).resolve().parents[1]
FLOOR = {"python": "pass", "numpy": "import numpy", "numpy + pandas": "import numpy, pandas"}
CLIS = ("analysis.overlap", "analysis.collectives", "analysis.advise")
CHARTS = ("plotly", "kaleido")
LOADED = "import sys, {module}.command; print(sorted({{m.split('.')[0] for m in sys.modules}} & {charts!r}))"


def timed(argv: list[str], before: list[str] | None = None) -> tuple[float, float]:
    """(wall s, CPU s) of one fresh process running argv; `before`: a folder to empty first (the cache)."""
    for folder in before or []:
        shutil.rmtree(folder, ignore_errors=True)
    env = {k: v for k, v in os.environ.items() if k != "ANALYSIS_NO_CACHE"}
    started = time.perf_counter()
    cpu = os.times()
    # a command may refuse the trace (advise without byte counts: exit 2, nothing kept): timed all the same
    subprocess.run(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    wall = time.perf_counter() - started
    after = os.times()
    return wall, (after.children_user - cpu.children_user) + (after.children_system - cpu.children_system)


def charts_loaded(module: str) -> list[str]:
    """The chart libraries importing `module` loads (none is the rule for a table CLI)."""
    code = LOADED.format(module=module, charts=set(CHARTS))
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.replace("'", '"'))


def commands(trace: Path | None) -> dict[str, tuple[list[str], list[str]]]:
    """name -> (argv, folders emptied before each run) for the imports and, with a trace, the commands."""
    out: dict[str, tuple[list[str], list[str]]] = {n: ([sys.executable, "-c", s], []) for n, s in FLOOR.items()}
    out.update({m: ([sys.executable, "-c", f"import {m}"], []) for m in CLIS})
    if trace is not None:
        cache = str(trace.parent / f".{trace.name}.analysis-cache")
        for m in CLIS:
            argv = [sys.executable, "-m", m, str(trace)]
            out[f"{m.split('.')[1]} cold"] = (argv, [cache])
            out[f"{m.split('.')[1]} warm"] = (argv, [])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="runs of each statement; the fastest is kept")
    parser.add_argument("--trace", type=Path, help="also time each table CLI on this export, cold and warm")
    parser.add_argument("--format", choices=("table", "json"), default="table")
    args = parser.parse_args()
    compile_project()  # timed as a user's installed project runs: its bytecode written
    with tempfile.TemporaryDirectory() as tmp:
        trace = None
        if args.trace is not None:
            trace = Path(tmp) / args.trace.name
            shutil.copy(args.trace, trace)
        todo = commands(trace)
        best = {name: (float("inf"), 0.0) for name in todo}
        for _ in range(args.repeat):
            for name, (argv, clear) in todo.items():  # a cold run comes before its warm one: that fills it
                best[name] = min(best[name], timed(argv, clear))
    floor = best["python"][0]
    rows: list[dict] = [
        {
            "run": name,
            "best_s": round(best[name][0], 3),
            "cpu_s": round(best[name][1], 3),
            "ours_s": round(best[name][0] - floor, 3) if name in CLIS else None,
            "charts": charts_loaded(name) if name in CLIS else None,
        }
        for name in todo
    ]
    load = os.getloadavg()[0]
    if args.format == "json":
        print(json.dumps({"repeat": args.repeat, "trace": str(args.trace), "load_average": load, "rows": rows}))
        return
    print(f"{'run':<22}{'best s':>8}{'cpu s':>8}{'ours s':>8}  charts loaded")
    for r in rows:
        ours = "" if r["ours_s"] is None else f"{r['ours_s']:.3f}"
        charts = "" if r["charts"] is None else (", ".join(r["charts"]) or "none")
        print(f"{r['run']:<22}{r['best_s']:>8.3f}{r['cpu_s']:>8.3f}{ours:>8}  {charts}")
    print(f"best of {args.repeat}, load average {load:.1f}" + (f"; trace {args.trace}" if args.trace else ""))


if __name__ == "__main__":
    main()
