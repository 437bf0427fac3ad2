"""Start-up of the table CLIs: the wall time of importing each in a fresh interpreter, beside the floor
(the interpreter alone, numpy, numpy + pandas), and whether a chart library came with it.

Each statement runs `--repeat` times in a fresh `python -c`, the statements interleaved so that load
from other processes falls on all alike; the fastest run of each is printed (the machine is shared:
the fastest is the least disturbed), with the load average. `ours` is a CLI's time less numpy + pandas.

    python benchmarks/startup.py                  # best of 5
    python benchmarks/startup.py --repeat 9 --format json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FLOOR = {"python": "pass", "numpy": "import numpy", "numpy + pandas": "import numpy, pandas"}
CLIS = ("analysis.overlap", "analysis.collectives", "analysis.advise")
CHARTS = ("plotly", "kaleido")
LOADED = "import sys, {module}; print(sorted({{m.split('.')[0] for m in sys.modules}} & {charts!r}))"


def wall(statement: str) -> float:
    """Seconds one fresh `python -c statement` takes, start to exit."""
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", statement], cwd=REPO, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - started


def charts_loaded(module: str) -> list[str]:
    """The chart libraries importing `module` loads (none is the rule for a table CLI)."""
    code = LOADED.format(module=module, charts=set(CHARTS))
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.replace("'", '"'))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="runs of each statement; the fastest is kept")
    parser.add_argument("--format", choices=("table", "json"), default="table")
    args = parser.parse_args()
    statements = {**FLOOR, **{m: f"import {m}" for m in CLIS}}
    best = dict.fromkeys(statements, float("inf"))
    for _ in range(args.repeat):
        for name, statement in statements.items():
            best[name] = min(best[name], wall(statement))
    floor = best["numpy + pandas"]
    rows: list[dict] = [
        {
            "import": name,
            "best_s": round(best[name], 3),
            "ours_s": round(best[name] - floor, 3) if name in CLIS else None,
            "charts": charts_loaded(name) if name in CLIS else None,
        }
        for name in statements
    ]
    load = os.getloadavg()[0]
    if args.format == "json":
        print(json.dumps({"repeat": args.repeat, "load_average": load, "rows": rows}))
        return
    print(f"{'import':<22}{'best s':>8}{'ours s':>8}  charts loaded")
    for r in rows:
        ours = "" if r["ours_s"] is None else f"{r['ours_s']:.3f}"
        charts = "" if r["charts"] is None else (", ".join(r["charts"]) or "none")
        print(f"{r['import']:<22}{r['best_s']:>8.3f}{ours:>8}  {charts}")
    print(f"best of {args.repeat}, load average {load:.1f}")


if __name__ == "__main__":
    main()
