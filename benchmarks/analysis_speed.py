"""Speed of `python -m analysis.overlap` on DDP-shaped nsys exports of growing size.

Writes synthetic exports (tests.support.synthetic_ddp: N kernels, N runtime calls, NVTX ranges over
8 ranks), then for each size runs the CLI in a fresh process (wall clock including interpreter
start and imports, CPU time and peak RSS from wait4) and, separately, times the load and metric phases
in-process. Beside it, up to --reference-max kernels, the plain-Python reference
(benchmarks/overlap_reference.py: sqlite3, dicts and lists, the tests' independent computation) in a
fresh process too, and whether its figures (each rank's whole-capture compute, comm, overlap and
backward overlap) equal the CLI's. Prints a table (or --format csv/json); the targets (issue 28): 1M
kernels x 8 ranks <= 1.5 s wall, 10M <= 12 s and 1 GB peak RSS; ns/kernel should stay flat as the size
grows (linear).

    python benchmarks/analysis_speed.py                       # 250k, 500k, 1M kernels, 8 ranks
    python benchmarks/analysis_speed.py --sizes 1000000 10000000 --repeat 3 --keep /tmp/bench
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

from cli_timing import timed_runs  # a sibling module: run as python benchmarks/analysis_speed.py

REPO = Path(__file__).resolve().parents[1]


def say(line: str) -> None:
    print(f"[analysis_speed] {line}", file=sys.stderr, flush=True)


def reference_run(path: Path, repeat: int) -> dict:
    """The plain-Python reference's fastest of `repeat` fresh-process runs (wall, CPU, peak RSS), and
    whether its figures equal analysis.overlap's on the same file."""
    runs = []
    with tempfile.TemporaryDirectory(prefix="analysis_speed_ref_") as tmp:
        out = Path(tmp) / "ref.json"
        for i in range(repeat):
            say(f"plain-Python reference on {path.name} (run {i + 1}/{repeat})")
            with open(out, "w") as f:
                started = time.perf_counter()
                proc = subprocess.Popen(
                    [sys.executable, str(REPO / "benchmarks" / "overlap_reference.py"), str(path)], stdout=f, cwd=REPO
                )
                _, status, usage = os.wait4(proc.pid, 0)
            if os.waitstatus_to_exitcode(status) != 0:
                raise SystemExit(f"overlap_reference.py failed on {path}")
            runs.append((time.perf_counter() - started, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024))
        figures = json.loads(out.read_text())
    ours = subprocess.run(
        [sys.executable, "-m", "analysis.overlap", str(path), "--format", "json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    totals = {str(r["rank"]): r["total"] for r in json.loads(ours.stdout)["traces"][0]["ranks"]}
    agree = set(totals) == set(figures) and all(
        abs(totals[r][k] - v) < 1e-6 for r, row in figures.items() for k, v in row.items()
    )
    wall, cpu, rss = min(runs)
    return {"ref_wall_s": wall, "ref_cpu_s": cpu, "ref_peak_rss_mb": rss, "ref_agrees": agree}


def measure(n_kernels: int, ranks: int, folder: Path, repeat: int, reference_max: int) -> dict:
    from tests.support.synthetic_ddp import write_ddp_trace

    path = folder / f"ddp_{n_kernels}k{ranks}r.sqlite"
    write_s = 0.0
    if not path.exists():
        say(f"writing {n_kernels:,} kernels over {ranks} ranks to {path}")
        started = time.perf_counter()
        write_ddp_trace(path, n_kernels=n_kernels, n_ranks=ranks)
        write_s = time.perf_counter() - started
    best, runs = timed_runs([path], repeat, path.name, say)
    ref = reference_run(path, repeat) if n_kernels <= reference_max else {}
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
        "peak_rss_b_per_kernel": max(r["peak_rss_mb"] for r in runs) * 2**20 / n_kernels,
        "load_avg": os.getloadavg()[0],
        **ref,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[250_000, 500_000, 1_000_000], help="kernel counts")
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--repeat", type=int, default=2, help="runs per size; the fastest is reported")
    p.add_argument("--keep", type=Path, metavar="DIR", help="keep (and reuse) the written exports in DIR")
    p.add_argument("--format", choices=["table", "csv", "json"], default="table")
    p.add_argument(
        "--reference-max",
        type=int,
        default=2_000_000,
        metavar="N",
        help="run the plain-Python reference up to this many kernels (its dicts take ~1 KB a kernel)",
    )
    args = p.parse_args(argv)
    if min(args.sizes) < args.ranks * 8 or args.ranks < 1 or args.repeat < 1:
        print("error: sizes must be >= 8 kernels per rank, ranks and repeat >= 1", file=sys.stderr)
        return 2
    sys.path.insert(0, str(REPO))
    with tempfile.TemporaryDirectory(prefix="analysis_speed_") as tmp:
        folder = args.keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        rows = [measure(n, args.ranks, folder, args.repeat, args.reference_max) for n in args.sizes]
    if args.format == "json":
        print(json.dumps(rows, indent=1))
        return 0
    import pandas as pd

    frame = pd.DataFrame(rows).reindex(
        columns=[
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
            "peak_rss_b_per_kernel",
            "ref_wall_s",
            "ref_cpu_s",
            "ref_peak_rss_mb",
            "ref_agrees",
            "load_avg",
        ]
    )
    print(frame.to_csv(index=False) if args.format == "csv" else frame.to_string(index=False, float_format="%.3f"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
