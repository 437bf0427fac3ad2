"""Speed of `python -m analysis.overlap` on DDP-shaped nsys exports of growing size.

Writes synthetic exports (tests.support.synthetic_ddp: N kernels, N runtime calls, NVTX ranges over
8 ranks), then for each size runs the CLI in a fresh process (wall clock including interpreter
start and imports, and its peak RSS from wait4) and, separately, times the load and metric phases
in-process. Prints a table (or --format csv/json); the target for 1M kernels is <= 2.5 s wall and
<= 1.5 GB peak RSS, and ns/kernel should stay flat as the size grows (linear).

    python benchmarks/analysis_speed.py                       # 250k, 500k, 1M kernels, 8 ranks
    python benchmarks/analysis_speed.py --sizes 1000000 --repeat 3 --keep /tmp/bench
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from cli_timing import timed_runs  # a sibling module: run as python benchmarks/analysis_speed.py

REPO = Path(__file__).resolve().parents[1]


def say(line: str) -> None:
    print(f"[analysis_speed] {line}", file=sys.stderr, flush=True)


def measure(n_kernels: int, ranks: int, folder: Path, repeat: int) -> dict:
    from tests.support.synthetic_ddp import write_ddp_trace

    path = folder / f"ddp_{n_kernels}k{ranks}r.sqlite"
    write_s = 0.0
    if not path.exists():
        say(f"writing {n_kernels:,} kernels over {ranks} ranks to {path}")
        started = time.perf_counter()
        write_ddp_trace(path, n_kernels=n_kernels, n_ranks=ranks)
        write_s = time.perf_counter() - started
    best, runs = timed_runs([path], repeat, path.name, say)
    say(
        f"{n_kernels:,} kernels: wall {best['wall_s']:.2f} s (runs {[round(r['wall_s'], 2) for r in runs]}), "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    return {
        "kernels": n_kernels,
        "ranks": ranks,
        "file_mb": path.stat().st_size / 2**20,
        "write_s": write_s,
        "wall_s": best["wall_s"],
        "cpu_s": best["cpu_s"],
        "walls_s": [round(r["wall_s"], 3) for r in runs],
        "peak_rss_mb": max(r["peak_rss_mb"] for r in runs),
        "import_s": best["import_s"],
        "load_s": best["load_s"],
        "metrics_s": best["metrics_s"],
        **best["rows"],
        "analysis_ns_per_kernel": (best["load_s"] + best["metrics_s"]) / n_kernels * 1e9,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[250_000, 500_000, 1_000_000], help="kernel counts")
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--repeat", type=int, default=2, help="runs per size; the fastest is reported")
    p.add_argument("--keep", type=Path, metavar="DIR", help="keep (and reuse) the written exports in DIR")
    p.add_argument("--format", choices=["table", "csv", "json"], default="table")
    args = p.parse_args(argv)
    if min(args.sizes) < args.ranks * 8 or args.ranks < 1 or args.repeat < 1:
        print("error: sizes must be >= 8 kernels per rank, ranks and repeat >= 1", file=sys.stderr)
        return 2
    sys.path.insert(0, str(REPO))
    with tempfile.TemporaryDirectory(prefix="analysis_speed_") as tmp:
        folder = args.keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        rows = [measure(n, args.ranks, folder, args.repeat) for n in args.sizes]
    if args.format == "json":
        print(json.dumps(rows, indent=1))
        return 0
    import pandas as pd

    frame = pd.DataFrame(rows)[
        [
            "kernels",
            "ranks",
            "gpu_ops",
            "nvtx",
            "file_mb",
            "wall_s",
            "cpu_s",
            "peak_rss_mb",
            "import_s",
            "load_s",
            "metrics_s",
            "analysis_ns_per_kernel",
        ]
    ]
    print(frame.to_csv(index=False) if args.format == "csv" else frame.to_string(index=False, float_format="%.3f"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
