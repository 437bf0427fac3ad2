"""Wall time of `bash run_nsys.sh IMPL` with its defaults, and the sizes of the traces it writes.

    python benchmarks/profiling_wall_time.py                    # overlap, into a temporary folder
    python benchmarks/profiling_wall_time.py naive overlap --format json -- --steps 5
Everything after `--` goes to run_nsys.sh as options.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("impls", nargs="*", default=["overlap"])
    p.add_argument("--format", choices=("table", "json"), default="table")
    args = p.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for impl in args.impls:
            print(f"[wall] bash run_nsys.sh {impl} {' '.join(extra)} ...", file=sys.stderr, flush=True)
            t0 = time.monotonic()
            res = subprocess.run(
                ["bash", str(REPO / "run_nsys.sh"), impl, "-o", tmp, "--format", "json", *extra],
                capture_output=True,
                text=True,
                env={**os.environ, "PYTHON": sys.executable},
            )
            wall = time.monotonic() - t0
            if res.returncode != 0:
                print(f"error: run_nsys.sh {impl} failed (exit {res.returncode}): {res.stderr[-600:]}", file=sys.stderr)
                return 1
            for out in json.loads(res.stdout):
                rows.append(
                    {
                        "impl": impl,
                        "wall_s": round(wall, 1),
                        "file": Path(out["sqlite"]).name,
                        "sqlite_kb": round(out["sqlite_bytes"] / 1024),
                        "nsys_rep_kb": round(out["report_bytes"] / 1024),
                    }
                )
    if args.format == "json":
        print(json.dumps(rows, indent=2))
    else:
        print(f"{'impl':<15} {'wall s':>7} {'file':<28} {'sqlite KB':>10} {'nsys-rep KB':>12}")
        for r in rows:
            print(f"{r['impl']:<15} {r['wall_s']:>7.1f} {r['file']:<28} {r['sqlite_kb']:>10} {r['nsys_rep_kb']:>12}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
