"""Do nsys and torch.profiler measure the same run alike? Overlap % per rank and step time, both profilers.

Records the same run (`run_nsys.sh IMPL` and `run_nsys.sh IMPL --profiler torch`, same options)
--repeats times, alternating the two profilers, analyses every recording with `analysis.overlap`,
and prints per repeat and rank: overlap % and step ms from each trace, and the run's own ms/step.
Then the means over repeats and the differences: targets are overlap % within 10 percentage
points per rank and step time within 10 %. On a shared machine run-to-run noise (visible between
repeats of one profiler) can exceed the difference between profilers: compare the spreads too.

    python benchmarks/profiler_agreement.py                         # overlap, 2 CPU ranks, 3 repeats
    python benchmarks/profiler_agreement.py --impl overlap --repeats 5 -- --steps 20
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RUN_TIMER = re.compile(r"([\d.]+) ms/step")


def say(line: str) -> None:
    print(f"[profiler_agreement] {line}", file=sys.stderr, flush=True)


def record(impl: str, profiler: str, out: Path, extra: list[str]) -> float:
    """Record one run; returns the run's own mean ms/step (slowest rank)."""
    cmd = ["bash", str(REPO / "run_nsys.sh"), impl, "-o", str(out), "--profiler", profiler, *extra]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"{profiler} run failed (exit {done.returncode}): {done.stderr[-1500:]}")
    return float(RUN_TIMER.findall(done.stderr)[-1])


def analyse(paths: list[Path]) -> dict[int, dict]:
    cmd = [sys.executable, "-m", "analysis.overlap", "--merge", "--format", "json", *map(str, paths)]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600, check=True)
    (trace,) = json.loads(done.stdout)["traces"]
    # as the table's per-rank row: overlap % of the per-step means
    total = lambda r, key: sum(s[key] for s in r["steps"])
    return {
        r["rank"]: {
            "overlap_pct": 100 * total(r, "overlap_ms") / total(r, "comm_ms"),
            "step_ms": statistics.mean(s["step_ms"] for s in r["steps"]),
        }
        for r in trace["ranks"]
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--impl", default="overlap")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--format", choices=["table", "json"], default="table")
    args = p.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="profiler_agreement_") as tmp:
        for i in range(args.repeats):
            for profiler in ("nsys", "torch"):
                out = Path(tmp) / f"{profiler}{i}"
                say(f"repeat {i + 1}/{args.repeats}: {profiler} ...")
                timer = record(args.impl, profiler, out, extra)
                paths = [out / f"{args.impl}.sqlite"] if profiler == "nsys" else sorted(out.glob("*.rank*.json.gz"))
                for rank, m in analyse(paths).items():
                    rows.append({"repeat": i, "profiler": profiler, "rank": rank, **m, "run_timer_ms": timer})
    means = {}
    for profiler in ("nsys", "torch"):
        for rank in sorted({r["rank"] for r in rows}):
            mine = [r for r in rows if r["profiler"] == profiler and r["rank"] == rank]
            means[(profiler, rank)] = {k: statistics.mean(r[k] for r in mine) for k in ("overlap_pct", "step_ms")}
    diffs = {
        rank: {
            "overlap_pp": means[("torch", rank)]["overlap_pct"] - means[("nsys", rank)]["overlap_pct"],
            "step_pct": 100 * (means[("torch", rank)]["step_ms"] / means[("nsys", rank)]["step_ms"] - 1),
        }
        for _, rank in means
    }
    if args.format == "json":
        print(json.dumps({"runs": rows, "differences": diffs}, indent=1))
        return 0
    print(f"{'repeat':>6} {'profiler':>8} {'rank':>4} {'overlap %':>9} {'step ms':>9} {'run timer ms':>12}")
    for r in rows:
        print(
            f"{r['repeat']:>6} {r['profiler']:>8} {r['rank']:>4} {r['overlap_pct']:>9.1f} {r['step_ms']:>9.1f} "
            f"{r['run_timer_ms']:>12.1f}"
        )
    for rank, d in diffs.items():
        print(
            f"rank {rank}: torch - nsys overlap {d['overlap_pp']:+.1f} pp (target within 10), "
            f"step time {d['step_pct']:+.1f} % (target within 10)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
