"""A wide HSDP run analysed per host: `analysis.overlap --merge --jobs N` over synthetic host files.

Writes an HSDP-shaped run of R ranks (tests/support/synthetic_groups.py: shard groups of S ranks, replicate
groups across them, each rank its own pace; the shard and replicate calls interleave) as R/P host files of P ranks
each, runs the overlap CLI on them as a fresh process, and prints its wall time, CPU time and peak RSS (wait4: the
largest of the CLI process and its workers), and what the JSON holds: ranks, groups per rank, calls paired.

    python benchmarks/groups_width.py                      # 512 ranks, 64 files of 8, --jobs 2
    python benchmarks/groups_width.py --ranks 64 --jobs 1 --keep /tmp/width64
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
sys.path.insert(0, str(REPO))

from tests.support.synthetic_groups import write_hsdp_trace  # noqa: E402


def host_files(folder: Path, ranks: int, per_file: int, shard: int, steps: int, calls: int) -> list[Path]:
    """The run's R/P host files in `folder` (written once: kept files are reused)."""
    files = []
    for h in range(ranks // per_file):
        path = folder / f"hsdp{ranks}.host{h:03d}.sqlite"
        if not path.exists():
            members = range(h * per_file, (h + 1) * per_file)
            write_hsdp_trace(path, shard=shard, replicas=ranks // shard, steps=steps, calls=calls, ranks=members)
        files.append(path)
    return files


def timed(args: list[str], out: Path) -> tuple[float, float, float]:
    """(wall s, CPU s, peak RSS MiB) of `python args` in a fresh process, its stdout to `out`."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "ANALYSIS_NO_CACHE": "1"}
    with out.open("wb") as stdout, tempfile.TemporaryFile() as err:  # files: nothing reads while wait4 waits
        started = time.perf_counter()
        proc = subprocess.Popen([sys.executable, *args], cwd=REPO, env=env, stdout=stdout, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - started
        if os.waitstatus_to_exitcode(status) != 0:
            err.seek(0)
            raise SystemExit(f"python {' '.join(args[:3])} ... failed: {err.read().decode()[-2000:]}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=512)
    p.add_argument("--per-file", type=int, default=8, help="ranks per host file")
    p.add_argument("--shard", type=int, default=8, help="ranks per shard group")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--calls", type=int, default=2, help="reduce-scatter + all-reduce pairs per step")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--keep", type=Path, help="write (and reuse) the files here instead of a temporary folder")
    args = p.parse_args(argv)
    if args.ranks % args.per_file or args.ranks % args.shard:
        raise SystemExit("--ranks must be a multiple of --per-file and --shard")
    with tempfile.TemporaryDirectory() as scratch:
        folder = args.keep or Path(scratch)
        folder.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        files = host_files(folder, args.ranks, args.per_file, args.shard, args.steps, args.calls)
        written = time.perf_counter() - started
        size = sum(f.stat().st_size for f in files) / 2**20
        out = Path(scratch) / "overlap.json"
        cmd = ["-m", "analysis.overlap", *map(str, files), "--merge", "--jobs", str(args.jobs), "--format", "json"]
        wall, cpu, peak = timed(cmd, out)
        ranks = json.loads(out.read_text())["traces"][0]["ranks"]
        groups = {len(r["groups"]) for r in ranks}
        print(f"{args.ranks} ranks in {len(files)} files ({size:.1f} MiB, written in {written:.1f} s)")
        print(
            f"analysis.overlap --merge --jobs {args.jobs}: wall {wall:.1f} s, CPU {cpu:.1f} s, peak RSS {peak:.0f} MiB"
        )
        print(
            f"JSON: {len(ranks)} ranks, process groups per rank {sorted(groups)}, load average {os.getloadavg()[0]:.1f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
