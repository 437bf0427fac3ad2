"""Many per-rank traces at once: `analysis.overlap --merge` over F one-rank files with --jobs 1,
--jobs 2 and a 2-worker Dask LocalCluster (`--dask local --jobs 2`).

Writes F synthetic, schema-true per-rank exports (tests.support.synthetic_ddp, K kernels each, captures
started a few ms apart), runs each configuration as a fresh CLI process, and prints its wall time,
the peak RSS of every process it started (the kernel's high-water mark VmHWM from /proc, read every
0.1 s for the CLI process and all its descendants), the speedup over --jobs 1, and whether the
JSON output is byte-identical to --jobs 1's, and the load average. Under load (other work on the
machine) wall times understate the parallel speedup; the CPU path (every process's CPU but the
workers', plus the busiest worker's) estimates the wall time on an idle machine with a core per
worker, and its ratio to --jobs 1's the speedup there. Exits 1 when outputs differ. Targets of issue 13 (on the
2-core machine, F=16, K=1M): --jobs 2 >= 1.7x faster than --jobs 1, every worker <= 0.6 GB.

    python benchmarks/analysis_scale.py                          # 16 files x 1M kernels (the acceptance run)
    python benchmarks/analysis_scale.py --files 4 --kernels 200000 --keep /tmp/scale_bench
    python benchmarks/analysis_scale.py --repeat 3 --keep /tmp/scale16   # the fastest of 3 runs in turns
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
from typing import Any

REPO = Path(__file__).resolve().parents[1]
CONFIGS = {"jobs 1": ["--jobs", "1"], "jobs 2": ["--jobs", "2"], "dask 2 workers": ["--dask", "local", "--jobs", "2"]}
SESSION_START = 1_779_782_330_000_000_000


def say(line: str) -> None:
    print(f"[analysis_scale] {line}", file=sys.stderr, flush=True)


def write_files(folder: Path, files: int, kernels: int) -> list[Path]:
    """run.rank<N>.sqlite for N < files (kept and reused when they exist with the same size)."""
    from tests.support.synthetic_ddp import write_ddp_trace

    paths = []
    for rank in range(files):
        path = folder / f"run{kernels}.rank{rank}.sqlite"
        if not path.exists():
            started = time.perf_counter()
            write_ddp_trace(
                path,
                n_kernels=kernels,
                n_ranks=1,
                first_rank=rank,
                world_size=files,
                seed=rank,
                session_start_utc_ns=SESSION_START + 1_000_000 * (rank % 7),
            )
            mb, took = path.stat().st_size / 2**20, time.perf_counter() - started
            say(f"wrote {path.name} ({mb:.0f} MB) in {took:.1f} s")
        paths.append(path)
    return paths


def peak_rss_mb(pid: int) -> float | None:
    """VmHWM of a live process in MB (None once it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmHWM:"))
    except (OSError, StopIteration):
        return None


def role(proc: Any, main_pid: int) -> str:
    """main (the CLI), forkserver / resource_tracker (its helpers), or worker (forked from the fork
    server, or a Dask worker)."""
    import psutil  # type: ignore[import-untyped]

    try:
        cmd, parent = " ".join(proc.cmdline()), proc.ppid()
    except psutil.Error:
        return "gone"
    if proc.pid == main_pid:
        return "main"
    for name in ("forkserver", "resource_tracker"):
        if name in cmd and parent == main_pid:
            return name
    return "worker"


def run(paths: list[Path], extra: list[str], out: Path) -> dict:
    """One fresh `python -m analysis.overlap ... --merge --format json` process; wall time and per-process peaks."""
    import psutil

    cmd = [sys.executable, "-m", "analysis.overlap", *map(str, paths), "--merge", "--format", "json", *extra]
    peaks: dict[int, tuple[str, float]] = {}
    cpu: dict[int, float] = {}  # user + system seconds, as last seen
    started = time.perf_counter()
    with open(out, "wb") as stdout:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=stdout, stderr=subprocess.PIPE)
        main = psutil.Process(proc.pid)
        while proc.poll() is None:
            try:
                tree = [main, *main.children(recursive=True)]
            except psutil.NoSuchProcess:
                break
            for p in tree:
                rss = peak_rss_mb(p.pid)
                if rss is not None:
                    known, seen = peaks.get(p.pid, ("", 0.0))
                    now = role(p, proc.pid)  # again each time: a process caught before its exec looks like its parent
                    peaks[p.pid] = (known if now == "gone" else now, max(rss, seen))
                try:
                    times = p.cpu_times()
                    cpu[p.pid] = times.user + times.system
                except psutil.Error:
                    pass
            time.sleep(0.1)
        assert proc.stderr is not None
        err = proc.stderr.read().decode()
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed (exit {proc.returncode}): {err.strip()[-500:]}")
    workers = [mb for r, mb in peaks.values() if r == "worker"]
    # What the run would take on an idle machine with a core per worker: the CPU of every process
    # but the workers runs before or after them (start-up, the fork server's imports, the merge,
    # the output), the workers' runs side by side. A lower bound under load, which slows the
    # parallel configurations most; its ratio to --jobs 1's is the speedup an idle machine would show.
    worker_cpu = [c for pid, c in cpu.items() if peaks.get(pid, ("", 0.0))[0] == "worker"]
    critical = sum(cpu.values()) - sum(worker_cpu) + max(worker_cpu, default=0.0)
    main_rss = max((mb for r, mb in peaks.values() if r == "main"), default=0.0)
    return {
        "wall_s": wall,
        "cpu_s": sum(cpu.values()),
        "critical_cpu_s": critical,
        "main_rss_mb": main_rss,
        "worker_rss_mb": max(workers, default=None),
        "workers": len(workers),
        "processes": {
            str(pid): {"role": r, "peak_rss_mb": round(mb, 1), "cpu_s": round(cpu.get(pid, 0.0), 2)}
            for pid, (r, mb) in peaks.items()
        },
    }


def _fastest(name: str, done: list[dict]) -> dict:
    """The fastest run of a configuration, with every run's wall time and the largest peaks of any run."""
    workers = [r["worker_rss_mb"] for r in done if r["worker_rss_mb"] is not None]
    return {
        "config": name,
        **min(done, key=lambda r: r["wall_s"]),
        "walls_s": [round(r["wall_s"], 2) for r in done],
        "main_rss_mb": max(r["main_rss_mb"] for r in done),
        "worker_rss_mb": max(workers, default=None),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--files", type=int, default=16, help="per-rank files (default 16)")
    p.add_argument("--kernels", type=int, default=1_000_000, help="kernels per file (default 1M)")
    p.add_argument("--keep", type=Path, metavar="DIR", help="keep (and reuse) the written exports in DIR")
    p.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="runs of each configuration, taken in turns; the fastest of each is reported, every wall time listed",
    )
    p.add_argument("--format", choices=["table", "json"], default="table")
    args = p.parse_args(argv)
    if args.files < 2 or args.kernels < 1_000 or args.repeat < 1:
        print("error: --files must be >= 2, --kernels >= 1000 and --repeat >= 1", file=sys.stderr)
        return 2
    import importlib.util

    if not all(importlib.util.find_spec(m) for m in ("distributed", "psutil")):
        print("error: needs the dask extra: pip install -e '.[dask]'", file=sys.stderr)
        return 2
    sys.path.insert(0, str(REPO))
    with tempfile.TemporaryDirectory(prefix="analysis_scale_") as tmp:
        folder = args.keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        paths = write_files(folder, args.files, args.kernels)
        runs: dict[str, list[dict]] = {name: [] for name in CONFIGS}
        outputs: dict[str, set[bytes]] = {name: set() for name in CONFIGS}
        load_before = os.getloadavg()  # other work on the machine slows the parallel runs most: say how much there was
        for turn in range(args.repeat):
            for name, extra in CONFIGS.items():  # in turns: a slow spell of the machine hits every configuration
                say(f"{name}: analysing {args.files} files of {args.kernels:,} kernels (run {turn + 1}/{args.repeat})")
                out = Path(tmp) / f"{name.replace(' ', '_')}.json"
                runs[name].append(run(paths, extra, out))
                outputs[name].add(out.read_bytes())
                say(f"{name}: {runs[name][-1]['wall_s']:.1f} s")
        load_after = os.getloadavg()
    rows = [_fastest(name, done) for name, done in runs.items()]
    base = rows[0]["wall_s"]
    for row in rows:
        row["speedup"] = base / row["wall_s"]
        row["idle_speedup"] = rows[0]["critical_cpu_s"] / row["critical_cpu_s"]
        row["identical"] = outputs[row["config"]] == outputs["jobs 1"] and len(outputs["jobs 1"]) == 1
    per_file = rows[0]["cpu_s"] / args.files  # CPU time: what the file costs whatever else runs beside it
    estimate = {f"{cores} cores": -(-1024 // cores) * per_file for cores in (1, 16, 128)}
    if args.format == "json":
        print(
            json.dumps(
                {
                    "files": args.files,
                    "kernels": args.kernels,
                    "runs": rows,
                    "per_file_cpu_s": per_file,
                    "estimate_1024_files_s": estimate,
                    "load_average_before": load_before,
                    "load_average_after": load_after,
                },
                indent=1,
            )
        )
    else:
        print(f"{args.files} per-rank files x {args.kernels:,} kernels, analysis.overlap --merge --format json")
        print(
            f"{'config':<16} {'wall s':>7} {'CPU s':>6} {'speedup':>7} {'CPU path s':>10} {'idle speedup':>12} "
            f"{'main RSS MB':>11} {'max worker RSS MB':>17} {'workers':>7} identical"
        )
        for r in rows:
            worker = "-" if r["worker_rss_mb"] is None else f"{r['worker_rss_mb']:.0f}"
            print(
                f"{r['config']:<16} {r['wall_s']:>7.2f} {r['cpu_s']:>6.1f} {r['speedup']:>7.2f} "
                f"{r['critical_cpu_s']:>10.1f} {r['idle_speedup']:>12.2f} "
                f"{r['main_rss_mb']:>11.0f} {worker:>17} {r['workers']:>7} {r['identical']}"
            )
        print(
            f"per file (--jobs 1): {base / args.files:.2f} s wall, {per_file:.2f} s CPU; 1,024 such files at that "
            "CPU cost, files shared evenly by the cores: "
            + ", ".join(f"{k} {v / 60:.1f} min" for k, v in estimate.items())
            + " (reading the files not limited by I/O)"
        )
        if args.repeat > 1:
            print(
                f"fastest of {args.repeat} runs shown (peak RSS: the largest of any run); wall s of every run: "
                + "; ".join(f"{r['config']} " + ", ".join(f"{w:.2f}" for w in r["walls_s"]) for r in rows)
            )
        print(
            "CPU path: the CPU of every process but the workers plus the busiest worker's, what the run takes on "
            "an idle machine with a core per worker; idle speedup: --jobs 1's CPU path over the config's"
        )
        print(
            "load average (1, 5, 15 min) before: "
            + ", ".join(f"{x:.2f}" for x in load_before)
            + "; after: "
            + ", ".join(f"{x:.2f}" for x in load_after)
        )
    return 0 if all(r["identical"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
