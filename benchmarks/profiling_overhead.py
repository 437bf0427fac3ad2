"""Profiling overhead: step time with no NVTX, with NVTX ranges but no profiler, under nsys, and under
torch.profiler (`--torch-trace`: record_function ranges, every op recorded).

    python benchmarks/profiling_overhead.py                 # overlap, 2 CPU ranks, tiny model
    python benchmarks/profiling_overhead.py --repeats 5 --format json

Two estimates, because on a shared CPU machine step times wander by more than the effect:
  measured  the median (and the least disturbed, min) step time of each mode over interleaved
            repeats of the same run, relative to the run without NVTX;
  modelled  NVTX calls per step (counted in the trace) x the cost of one range (timed in a loop,
            with and without nsys recording it), as a share of the step time.
Targets: NVTX without a profiler < 1 % of step time; under nsys < 5 %.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from profiling.nsys import NsysError, export_sqlite, find_nsys  # noqa: E402
from profiling.session import START_ATTEMPTS, NsysOptions, nsys_failed_to_start, profile_command, profiled_env  # noqa: E402

MODES = ("no NVTX", "NVTX, no profiler", "NVTX under nsys", "torch.profiler")


def run_retrying(cmd: list[str], timeout_s: float) -> subprocess.CompletedProcess:
    """Run `cmd`, again when nsys itself failed to start (see profiling.session)."""
    for attempt in range(1, START_ATTEMPTS + 1):
        out = subprocess.run(cmd, capture_output=True, text=True, env=profiled_env(), cwd=REPO, timeout=timeout_s)
        if out.returncode == 0 or attempt == START_ATTEMPTS or not nsys_failed_to_start(out.stdout + out.stderr):
            return out
        time.sleep(attempt)
    return out


def range_cost_ns(n: int) -> float:
    """Mean ns for one push/pop range through ddp.comm.nvtx_ranges, inside the `profile` capture range."""
    from contract import ALL_REDUCE, PROFILE, comm_range
    from ddp.comm import nvtx_ranges

    names = [comm_range(ALL_REDUCE, f"p{i}") for i in range(16)]
    with nvtx_ranges.range(PROFILE):
        t0 = time.perf_counter_ns()
        for i in range(n):
            with nvtx_ranges.range(names[i % 16]):
                pass
        return (time.perf_counter_ns() - t0) / n


def timed_range_cost(nsys: Path | None, n: int) -> float:
    """range_cost_ns in a fresh process, under nsys when `nsys` is given."""
    prog = [sys.executable, __file__, "--range-cost", str(n)]
    with tempfile.TemporaryDirectory() as tmp:
        cmd = prog if nsys is None else profile_command(nsys, NsysOptions(), Path(tmp) / "cost.nsys-rep", prog)
        out = run_retrying(cmd, 600)
    lines = [line for line in out.stdout.splitlines() if line.startswith("ns_per_range ")]
    if out.returncode != 0 or not lines:
        raise RuntimeError(f"range cost run failed (exit {out.returncode}): {(out.stdout + out.stderr)[-800:]}")
    return float(lines[-1].split()[1])


def run_once(mode: str, nsys: Path, runner: list[str], scratch: Path) -> tuple[float, Path | None]:
    """One training run in `mode`: (slowest-rank mean step time in s, its sqlite export if profiled)."""
    cmd = [*runner, "--nvtx", "off" if mode == "no NVTX" else "on", "--format", "json"]
    report = scratch / "overhead.nsys-rep"
    if mode == "NVTX under nsys":
        cmd = profile_command(nsys, NsysOptions(), report, cmd)
    if mode == "torch.profiler":
        cmd += ["--torch-trace", str(scratch / "overhead")]
    out = run_retrying(cmd, 900)
    results = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode != 0 or not results:
        raise RuntimeError(f"{mode} run failed (exit {out.returncode}): {(out.stdout + out.stderr)[-800:]}")
    sqlite = None
    if mode == "NVTX under nsys":
        sqlite = export_sqlite(nsys, report, scratch / "overhead.sqlite")
    return results[-1]["avg_step_time_s"], sqlite


def ranges_per_step(sqlite: Path) -> float:
    """NVTX ranges and marks one rank issues per step, counted in the trace (rank-mean)."""
    con = sqlite3.connect(f"file:{sqlite}?mode=ro", uri=True)
    q = """SELECT COUNT(*), COUNT(DISTINCT (globalTid >> 24) & 16777215) FROM NVTX_EVENTS
           WHERE eventType IN (34, 59, 60)"""
    events, ranks = con.execute(q).fetchone()
    steps = con.execute("""SELECT COUNT(*) FROM NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = e.textId
                           WHERE COALESCE(e.text, s.value) LIKE 'step %'""").fetchone()[0]
    con.close()
    return events / steps if steps else float("nan") if ranks else 0.0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--impl", default="overlap")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3, help="interleaved runs per mode (default: %(default)s)")
    p.add_argument("--range-calls", type=int, default=200_000, help="loop length for the per-range cost")
    p.add_argument("--format", choices=("table", "json"), default="table")
    p.add_argument("--range-cost", type=int, help=argparse.SUPPRESS)  # internal: child process mode
    args, runner_extra = p.parse_known_args()
    if args.range_cost:
        print(f"ns_per_range {range_cost_ns(args.range_cost):.1f}")
        return 0
    nsys = find_nsys()
    runner = [
        sys.executable,
        "-m",
        "profiling.run",
        "--impl",
        args.impl,
        "--steps",
        str(args.steps),
        "--warmup",
        str(args.warmup),
        *runner_extra,
    ]
    print("[overhead] timing one NVTX range with and without nsys ...", file=sys.stderr, flush=True)
    cost_plain, cost_nsys = timed_range_cost(None, args.range_calls), timed_range_cost(nsys, args.range_calls)
    step_s: dict[str, list[float]] = {m: [] for m in MODES}
    with tempfile.TemporaryDirectory() as tmp:
        sqlite = None
        for r in range(args.repeats):
            for mode in MODES:
                print(f"[overhead] repeat {r + 1}/{args.repeats}: {mode} ...", file=sys.stderr, flush=True)
                seconds, exported = run_once(mode, nsys, runner, Path(tmp))
                step_s[mode].append(seconds)
                sqlite = exported or sqlite
        if sqlite is None:  # cannot happen: every repeat runs each mode, one of them under nsys
            raise RuntimeError("no nsys export to count the NVTX ranges in")
        per_step = ranges_per_step(sqlite)
    base = statistics.median(step_s["no NVTX"])
    report = {
        "impl": args.impl,
        "steps": args.steps,
        "repeats": args.repeats,
        "runner": runner[1:],
        "median_step_ms": {m: 1e3 * statistics.median(v) for m, v in step_s.items()},
        "all_step_ms": {m: [round(1e3 * x, 2) for x in v] for m, v in step_s.items()},
        "measured_overhead_pct": {m: 100 * (statistics.median(v) / base - 1) for m, v in step_s.items()},
        "min_step_ms": {m: 1e3 * min(v) for m, v in step_s.items()},
        "measured_min_overhead_pct": {m: 100 * (min(v) / min(step_s["no NVTX"]) - 1) for m, v in step_s.items()},
        "nvtx_events_per_step": per_step,
        "ns_per_range": {"no profiler": cost_plain, "nsys": cost_nsys},
        "modelled_overhead_pct": {
            "NVTX, no profiler": 100 * per_step * cost_plain * 1e-9 / base,
            "NVTX under nsys": 100 * per_step * cost_nsys * 1e-9 / base,
        },
    }
    if args.format == "json":
        print(json.dumps(report, indent=2))
        return 0
    print(
        f"{args.impl}: {args.steps} steps x {args.repeats} interleaved repeats; "
        f"{per_step:.1f} NVTX events per rank per step"
    )
    print(
        f"{'mode':<20} {'median step ms':>15} {'median %':>9} {'min step ms':>12} {'min %':>7} "
        f"{'modelled %':>11}   all runs (ms)"
    )
    for m in MODES:
        modelled = report["modelled_overhead_pct"].get(m)
        print(
            f"{m:<20} {report['median_step_ms'][m]:>15.1f} {report['measured_overhead_pct'][m]:>+9.2f} "
            f"{report['min_step_ms'][m]:>12.1f} {report['measured_min_overhead_pct'][m]:>+7.2f} "
            f"{'' if modelled is None else f'{modelled:.4f}':>11}   {report['all_step_ms'][m]}"
        )
    print(f"one NVTX range: {cost_plain:.0f} ns without a profiler, {cost_nsys:.0f} ns under nsys")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONPATH", str(REPO))
    try:
        sys.exit(main())
    except (RuntimeError, NsysError) as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(1)
