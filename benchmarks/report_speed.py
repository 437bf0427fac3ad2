"""`analysis.report` against `analysis.overlap` on the same traces (issue 19: the report within 2x).

    python benchmarks/report_speed.py [--repeat 3] [--fixtures DIR] [TRACE ...]

Without TRACEs: the five real H100 exports of ../shared/data/gpu_h100 (naive, overlap, overlap_bucket,
flat, torch), decompressed once into --fixtures (default /tmp/report_speed_fixtures, never the repo).
Each CLI runs in a fresh process (interpreter start, imports, reading and writing included), `repeat`
times, alternating; the fastest of each is kept (the machine is shared: the fastest run is the least
disturbed). Prints wall and CPU seconds (user + system, from wait4) of both, the report/overlap ratios
and the load average before and after. Exit code 1 when the wall ratio of the fastest runs exceeds 2.
"""

from __future__ import annotations

import argparse
import lzma
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GPU_DATA = REPO.parent / "shared" / "data" / "gpu_h100"
FIXTURES = ("naive", "overlap", "overlap_bucket", "flat", "torch")
TARGET_RATIO = 2.0


def decompressed_fixtures(folder: Path) -> list[Path]:
    """The five H100 exports as plain SQLite files in `folder`, decompressed on first use."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for name in FIXTURES:
        src, dst = GPU_DATA / f"{name}.sqlite.xz", folder / f"{name}.sqlite"
        if not dst.exists():
            if not src.exists():
                raise SystemExit(f"error: {src} not found (the real H100 traces live in ../shared/data)")
            part = dst.with_suffix(".part")
            with lzma.open(src) as fin, part.open("wb") as fout:
                shutil.copyfileobj(fin, fout)
            part.rename(dst)
        paths.append(dst)
    return paths


def run_cli(args: list[str]) -> tuple[float, float]:
    """(wall s, CPU s) of one `python -m ARGS` process; exits on a non-zero status."""
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", *args], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        err = proc.stderr.read().decode(errors="replace").strip() if proc.stderr else ""
        raise SystemExit(f"error: python -m {' '.join(args)} exited {code}: {err[-400:]}")
    return wall, usage.ru_utime + usage.ru_stime


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("traces", nargs="*", type=Path, metavar="TRACE", help="traces (default: the five H100 exports)")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each CLI; the fastest is kept (default 3)")
    ap.add_argument("--fixtures", type=Path, default=Path(tempfile.gettempdir()) / "report_speed_fixtures")
    ap.add_argument("--no-timelines", action="store_true", help="pass --no-timelines to the report")
    opts = ap.parse_args()
    paths = [p.resolve() for p in opts.traces] or decompressed_fixtures(opts.fixtures)
    files = [str(p) for p in paths]
    load_before = load()
    best: dict[str, tuple[float, float]] = {}
    with tempfile.TemporaryDirectory(prefix="report_speed_") as out:
        commands = {
            "overlap": ["analysis.overlap", *files, "--format", "csv"],
            "report": ["analysis.report", *files, "-o", out, "--format", "csv"]
            + (["--no-timelines"] if opts.no_timelines else []),
        }
        for i in range(opts.repeat):
            for name, args in commands.items():
                wall, cpu = run_cli(args)
                print(f"[bench] run {i + 1}/{opts.repeat} {name}: {wall:.2f} s wall, {cpu:.2f} s CPU", file=sys.stderr)
                if name not in best or wall < best[name][0]:
                    best[name] = (wall, cpu)
    (ow, oc), (rw, rc) = best["overlap"], best["report"]
    print(f"traces: {', '.join(p.name for p in paths)} ({sum(p.stat().st_size for p in paths) / 1e6:.0f} MB)")
    print(f"load average before: {load_before}; after: {load()}; best of {opts.repeat}")
    print(f"{'command':<16}{'wall_s':>8}{'cpu_s':>8}")
    print(f"{'analysis.overlap':<16}{ow:>8.2f}{oc:>8.2f}")
    print(f"{'analysis.report':<16}{rw:>8.2f}{rc:>8.2f}")
    print(f"report/overlap: {rw / ow:.2f}x wall, {rc / oc:.2f}x CPU (target <= {TARGET_RATIO:g}x)")
    return 0 if rw / ow <= TARGET_RATIO else 1


if __name__ == "__main__":
    sys.exit(main())
