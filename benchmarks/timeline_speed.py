"""Timeline speed on a large trace: generation time, HTML size and headless render time.

    python benchmarks/timeline_speed.py [--kernels 1000000] [--ranks 8] [--trace PATH] [--no-browser]

Writes (once) the analysis issue's DDP-shaped synthetic trace (1M kernels over 8 ranks) into
bench_out/, then times `python -m analysis.timeline` as a user runs it (fresh process, imports and
loading included) for one step and for the whole trace, and opens both pages in headless Chromium.
Targets: one step <= 10 s, whole trace <= 20 s, HTML <= 20 MB, render <= 5 s. Prints a table;
exit code 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support.html_check import check_page, find_chromium  # noqa: E402

CPU_S: list[float] = []  # CPU seconds of each timed command: on a shared machine wall time says little
TARGETS = {"step_s": 10.0, "overview_s": 20.0, "html_mb": 20.0, "render_s": 5.0}


def ensure_trace(path: Path, kernels: int, ranks: int) -> Path:
    if path.exists():
        return path
    from tests.support.synthetic_ddp import write_ddp_trace

    t0 = time.perf_counter()
    path.parent.mkdir(parents=True, exist_ok=True)
    write_ddp_trace(path, n_kernels=kernels, n_ranks=ranks)
    print(
        f"[bench] wrote {path} ({kernels} kernels, {ranks} ranks) in {time.perf_counter() - t0:.1f} s", file=sys.stderr
    )
    return path


def middle_step(trace: Path) -> int:
    import sqlite3

    with sqlite3.connect(f"file:{trace}?mode=ro", uri=True) as db:
        n = db.execute("SELECT count(*) FROM NVTX_EVENTS WHERE text LIKE 'step %'").fetchone()[0]
        ranks = db.execute(
            "SELECT count(DISTINCT globalTid >> 24) FROM NVTX_EVENTS WHERE text LIKE 'step %'"
        ).fetchone()[0]
    return max(n // max(ranks, 1) // 2, 0)


def time_cli(args: list[str]) -> float:
    """Wall seconds of one `python -m analysis.timeline` run; its CPU seconds (user + sys) go to CPU_S."""
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "analysis.timeline", *args, "--format", "csv"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    CPU_S.append(r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime)
    if done.returncode != 0:
        raise SystemExit(f"timeline failed: {done.stderr.strip()}")
    print(done.stderr.strip(), file=sys.stderr)
    return wall


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kernels", type=int, default=1_000_000, help="kernels in the synthetic trace")
    ap.add_argument("--ranks", type=int, default=8, help="ranks in the synthetic trace")
    ap.add_argument("--trace", type=Path, help="use this export instead of the synthetic one")
    ap.add_argument("--no-browser", action="store_true", help="skip the headless render timing")
    args = ap.parse_args()
    out = REPO / "bench_out"
    synthetic = out / f"ddp_{args.kernels}_kernels_{args.ranks}_ranks.sqlite"
    trace = args.trace or ensure_trace(synthetic, args.kernels, args.ranks)
    step = middle_step(trace)
    pages = {"step": out / "timeline_step.html", "overview": out / "timeline_overview.html"}
    figures = {
        "step_s": time_cli([str(trace), "-o", str(pages["step"]), "--step", str(step)]),
        "overview_s": time_cli([str(trace), "-o", str(pages["overview"])]),
    }
    sizes = {k: p.stat().st_size / 1e6 for k, p in pages.items()}
    figures["html_mb"] = max(sizes.values())
    rows: list[tuple[str, str, float | None]] = [
        ("one step's timeline (s)", f"{figures['step_s']:.1f}", TARGETS["step_s"]),
        ("whole-trace overview (s)", f"{figures['overview_s']:.1f}", TARGETS["overview_s"]),
        ("CPU time (user + sys), step / overview (s)", " / ".join(f"{c:.1f}" for c in CPU_S), None),
        ("HTML, step / overview (MB)", f"{sizes['step']:.1f} / {sizes['overview']:.1f}", TARGETS["html_mb"]),
    ]
    if not args.no_browser and find_chromium():
        checks = {k: check_page(p, timeout_s=300) for k, p in pages.items()}
        figures["render_s"] = max(c.render_ms for c in checks.values()) / 1e3
        errors = [e for c in checks.values() for e in c.errors]
        rows.append(
            (
                "headless render, step / overview (s)",
                " / ".join(f"{c.render_ms / 1e3:.2f}" for c in checks.values()),
                TARGETS["render_s"],
            )
        )
        rows.append(
            ("browser start-to-exit, step / overview (s)", " / ".join(f"{c.wall_s:.1f}" for c in checks.values()), None)
        )
        if errors:
            rows.append(("console errors", str(len(errors)), None))
    print(f"trace: {trace} ({trace.stat().st_size / 1e6:.0f} MB), step {step}")
    print(f"load average at the end: {' '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} cores")
    width = max(len(r[0]) for r in rows)
    for name, value, limit in rows:
        print(f"{name:<{width}}  {value:>13}  {'<= ' + str(limit) if limit else ''}")
    failed = [k for k, v in figures.items() if v > TARGETS[k]]
    print("all targets met" if not failed else f"targets missed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
