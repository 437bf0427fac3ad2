"""Speed of `python -m analysis.overlap` on torch.profiler (Kineto) traces of growing size.

Writes DDP-shaped Kineto traces (tests.support.synthetic_kineto: N kernels, each with its cudaLaunchKernel
runtime event and the two ac2g flow events Kineto writes, plus the step/phase/comm annotations; one
file per rank), then for each size runs the CLI in a fresh process (wall clock including interpreter
start and imports, CPU time of the process and its workers, and peak RSS from wait4) and, separately,
times load and metrics in-process. Beside it, the plain-Python reference (kineto_reference.py: json and
loops, no numpy) computes the same per-step figures in a fresh process, timed the same way; `ref_diff_ms`
is the largest difference between its totals and the CLI's (sums over every rank's steps of step,
comm, compute, overlap and exposed comm), which should be 0. Target (issue 28) for 1M kernels: <= 2 s
wall for the whole CLI, memory bounded. JSON decoding is most of the cost; CPU time is the figure that
other processes on the machine inflate least.

    python benchmarks/kineto_speed.py                          # 1M kernels, one rank, .json
    python benchmarks/kineto_speed.py --sizes 250000 1000000 --gz --keep /tmp/kineto_bench
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

from cli_timing import timed_runs  # a sibling module: run as python benchmarks/kineto_speed.py

REPO = Path(__file__).resolve().parents[1]


def say(line: str) -> None:
    print(f"[kineto_speed] {line}", file=sys.stderr, flush=True)


def write_in_child(stem: Path, n_kernels: int, ranks: int, gz: bool) -> None:
    """Write the trace in a child process: a CLI forked later from a process that had held the whole trace
    would inherit its RSS high-water mark, and wait4 would report the writer's peak as the analysis'."""
    code = (
        "import sys; from pathlib import Path; from tests.support.synthetic_kineto import write_kineto_ddp_trace; "
        "write_kineto_ddp_trace(Path(sys.argv[1]), n_kernels=int(sys.argv[2]), n_ranks=int(sys.argv[3]), "
        "gz=sys.argv[4] == '1')"
    )
    subprocess.run(
        [sys.executable, "-c", code, str(stem), str(n_kernels), str(ranks), "1" if gz else "0"],
        cwd=REPO,
        check=True,
        timeout=1800,
    )


FIGURES = ("step_ms", "comm_ms", "compute_ms", "overlap_ms", "exposed_comm_ms")


def timed(cmd: list[str]) -> tuple[float, float, float, str]:
    """(wall s, CPU s, peak RSS MB, stdout) of one fresh process (its workers' CPU and RSS included)."""
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    out = proc.stdout.read() if proc.stdout else b""
    _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(cmd[:4])} ... failed")
    return time.perf_counter() - started, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, out.decode()


def ours(paths: list[Path]) -> dict:
    """The CLI's figures summed over every rank's steps (one untimed run)."""
    cmd = [sys.executable, "-m", "analysis.overlap", "--merge", *map(str, paths), "--format", "json"]
    runs = json.loads(timed(cmd)[3])["traces"]
    steps = [s for t in runs for r in t["ranks"] for s in r["steps"]]
    return {k: sum(s[k] for s in steps) for k in FIGURES}


def reference(paths: list[Path], repeat: int) -> dict:
    """The plain-Python reference's figures and its fastest run (wall, CPU, peak RSS)."""
    cmd = [sys.executable, str(REPO / "benchmarks" / "kineto_reference.py"), *map(str, paths)]
    runs = [timed(cmd) for _ in range(repeat)]
    wall, cpu, _, out = min(runs)
    return {"ref_wall_s": wall, "ref_cpu_s": cpu, "ref_peak_rss_mb": max(r[2] for r in runs), **json.loads(out)}


def measure(n_kernels: int, ranks: int, gz: bool, folder: Path, repeat: int) -> dict:
    stem = folder / f"kineto_{n_kernels}k{ranks}r"
    paths = [Path(f"{stem}.rank{r}.json{'.gz' if gz else ''}") for r in range(ranks)]
    write_s = 0.0
    if not all(p.exists() for p in paths):
        say(f"writing {n_kernels:,} kernels over {ranks} rank file(s) to {stem}.rank*")
        started = time.perf_counter()
        write_in_child(stem, n_kernels, ranks, gz)
        write_s = time.perf_counter() - started
    best, runs = timed_runs(paths, repeat, f"{stem.name}.rank*", say)
    say(f"plain-Python reference on {stem.name}.rank*")
    ref, figures = reference(paths, repeat), ours(paths)
    say(
        f"{n_kernels:,} kernels: wall {best['wall_s']:.2f} s, CPU {best['cpu_s']:.2f} s, "
        f"peak RSS {best['peak_rss_mb']:.0f} MB; reference wall {ref['ref_wall_s']:.2f} s, "
        f"CPU {ref['ref_cpu_s']:.2f} s, "
        f"peak RSS {ref['ref_peak_rss_mb']:.0f} MB; load average {os.getloadavg()[0]:.1f}"
    )
    return {
        "kernels": n_kernels,
        "ranks": ranks,
        "gz": gz,
        "file_mb": sum(p.stat().st_size for p in paths) / 2**20,
        "write_s": write_s,
        "wall_s": best["wall_s"],
        "cpu_s": best["cpu_s"],
        "peak_rss_mb": max(r["peak_rss_mb"] for r in runs),
        "import_s": best["import_s"],
        "load_s": best["load_s"],
        "metrics_s": best["metrics_s"],
        "ref_wall_s": ref["ref_wall_s"],
        "ref_cpu_s": ref["ref_cpu_s"],
        "ref_peak_rss_mb": ref["ref_peak_rss_mb"],
        "speedup": ref["ref_wall_s"] / best["wall_s"],
        "ref_diff_ms": max(abs(ref[k] - figures[k]) for k in FIGURES),
        **best["rows"],
        "load_avg": os.getloadavg()[0],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[1_000_000], help="kernel counts (default: 1M)")
    p.add_argument("--ranks", type=int, default=1, help="one file per rank, kernels split evenly (default 1)")
    p.add_argument(
        "--gz",
        action="store_true",
        help="gzipped traces (.json.gz), as tensorboard_trace_handler(use_gzip=True) writes them",
    )
    p.add_argument("--repeat", type=int, default=1, help="runs per size; the fastest is reported")
    p.add_argument("--keep", type=Path, metavar="DIR", help="keep (and reuse) the written traces in DIR")
    p.add_argument("--format", choices=["table", "csv", "json"], default="table")
    args = p.parse_args(argv)
    if min(args.sizes) < args.ranks * 400 or args.ranks < 1 or args.repeat < 1:
        print("error: sizes must be >= 400 kernels per rank, ranks and repeat >= 1", file=sys.stderr)
        return 2
    sys.path.insert(0, str(REPO))
    with tempfile.TemporaryDirectory(prefix="kineto_speed_") as tmp:
        folder = args.keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        rows = [measure(n, args.ranks, args.gz, folder, args.repeat) for n in args.sizes]
    if args.format == "json":
        print(json.dumps(rows, indent=1))
        return 0
    import pandas as pd

    frame = pd.DataFrame(rows)[
        [
            "kernels",
            "ranks",
            "gz",
            "gpu_ops",
            "nvtx",
            "file_mb",
            "wall_s",
            "cpu_s",
            "peak_rss_mb",
            "import_s",
            "load_s",
            "metrics_s",
            "ref_wall_s",
            "ref_cpu_s",
            "ref_peak_rss_mb",
            "speedup",
            "ref_diff_ms",
            "load_avg",
        ]
    ]
    print(frame.to_csv(index=False) if args.format == "csv" else frame.to_string(index=False, float_format="%.3f"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
