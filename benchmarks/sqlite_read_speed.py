"""Reading an nsys export both ways the reader can: connectorx (one connection per SELECT, straight to
Arrow) against the standard library's sqlite3 (the one connection the reader holds anyway, rows fetched
into numpy), each as `trace/readers/read.read_trace` in a fresh process, alternating, the fastest of each kept.

    python benchmarks/analysis_speed.py --sizes 1000000 --keep /tmp/bench     # writes the 1M x 8 export
    python benchmarks/sqlite_read_speed.py /tmp/bench/ddp_1000000k8r.sqlite --repeat 3
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
READ = """
import json, sys, time
from pathlib import Path
import analysis.trace.readers.sqlite_read as sqlite_read
from analysis.trace.readers.read import read_trace
if sys.argv[1] == "sqlite3":
    sqlite_read.process_threads = lambda: sqlite_read.MAX_PROCESS_THREADS  # the reader's sqlite3 path
t0, c0 = time.perf_counter(), time.process_time()
trace = read_trace([Path(sys.argv[2])])
wall, cpu = time.perf_counter() - t0, time.process_time() - c0
print(json.dumps({"wall_s": wall, "cpu_s": cpu, "gpu_ops": len(trace.gpu_ops)}))
"""


def read_once(how: str, path: Path) -> dict:
    """wall_s, cpu_s (all threads) and rows of one read of `path` the `how` way, in a fresh process."""
    out = subprocess.run(
        [sys.executable, "-c", READ, how, str(path)], cwd=REPO, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("export", type=Path)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    runs: dict[str, list[dict]] = {"connectorx": [], "sqlite3": []}
    for _ in range(args.repeat):
        for how in runs:
            runs[how].append(read_once(how, args.export))
    print(f"{'reader':<12}{'wall s':>8}{'cpu s':>8}  rows")
    for how, done in runs.items():
        best = min(done, key=lambda r: r["wall_s"])
        print(f"{how:<12}{best['wall_s']:>8.2f}{min(r['cpu_s'] for r in done):>8.2f}  {best['gpu_ops']:,}")
    print(f"best of {args.repeat}, load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
