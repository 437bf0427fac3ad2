"""The four headline measurements, before and after a change, side by side in one run.

Each measurement runs a CLI in a fresh process with PYTHONPATH at one code tree, before and after in
turns (so that load from other work on the machine falls on both alike), with the analysis cache off
(ANALYSIS_NO_CACHE=1: every run is a first look) and the trees' bytecode compiled first (as a user's
installation has it). It prints, per measurement, the wall time (median
and range over the runs) and the peak RSS of the CLI process and its children (wait4), before and
after, with the change in %.

    nsys_1m_x8     python -m analysis.overlap ddp_1000000k8r.sqlite --format json
    nsys_10m_x8    python -m analysis.overlap ddp_10000000k8r.sqlite --format json
    kineto_1m      python -m analysis.overlap kineto_1000000.rank0.json --format json
    report_h100    python -m analysis.report of the five H100 exports (naive, flat, overlap,
                   overlap_bucket, torch), decompressed once from ../shared/data/gpu_h100

On a machine other work keeps busy, the second core the commands overlap their reading with is never
idle, and the wall times say little; run the script at real-time priority (`chrt -f 10 python
benchmarks/headline.py ...`, as root) to time them as on an idle machine: plain `nice` does not reach
across the scheduler's per-session groups.

The synthetic inputs are written once (tests.support.synthetic_ddp / synthetic_kineto, as
analysis_speed.py and kineto_speed.py write them) into --inputs and reused.

    git worktree add /tmp/before main~5                                  # the code to compare with
    python benchmarks/headline.py --before /tmp/before                   # after: this tree
    python benchmarks/headline.py --before /tmp/old --after . --only kineto_1m --repeat 5
"""

from __future__ import annotations

import argparse
import lzma
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
H100 = ("naive", "flat", "overlap", "overlap_bucket", "torch")


def say(line: str) -> None:
    print(f"[headline] {line}", file=sys.stderr, flush=True)


def written(path: Path, code: str) -> Path:
    """path, written first by `code` (Python run in a child from this repo, with `path` as sys.argv[1])."""
    if not path.exists():
        say(f"writing {path}")
        path.parent.mkdir(parents=True, exist_ok=True)
        part = path.with_name("part." + path.name)  # renamed once whole: an interrupted write is not reused
        subprocess.run([sys.executable, "-c", code, str(part)], cwd=REPO, check=True)
        part.replace(path)
    return path


def nsys_export(folder: Path, kernels: int) -> Path:
    code = (
        "import sys; from tests.support.synthetic_ddp import write_ddp_trace; "
        f"write_ddp_trace(sys.argv[1], n_kernels={kernels}, n_ranks=8)"
    )
    return written(folder / f"ddp_{kernels}k8r.sqlite", code)


def kineto_trace(folder: Path, kernels: int) -> Path:
    code = (
        "import sys; from tests.support.synthetic_kineto import write_kineto_ddp_trace; "
        f"write_kineto_ddp_trace(sys.argv[1].removesuffix('.rank0.json'), n_kernels={kernels})"
    )
    return written(folder / f"kineto_{kernels}.rank0.json", code)


def h100_exports(folder: Path) -> list[Path]:
    """The five H100 exports, decompressed into folder/gpu_h100 once."""
    paths = []
    for name in H100:
        path = folder / "gpu_h100" / f"{name}.sqlite"
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            with lzma.open(REPO.parent / "shared/data/gpu_h100" / f"{name}.sqlite.xz") as src, open(path, "wb") as dst:
                shutil.copyfileobj(src, dst)
        paths.append(path)
    return paths


def overlap(path: Callable[[], Path]) -> Callable[[Path], list[str]]:
    return lambda scratch: ["-m", "analysis.overlap", str(path()), "--format", "json"]


def report(folder: Path) -> Callable[[Path], list[str]]:
    return lambda scratch: [
        "-m",
        "analysis.report",
        *map(str, h100_exports(folder)),
        "-o",
        str(scratch / "report"),
    ]


def measurements(folder: Path) -> dict[str, Callable[[Path], list[str]]]:
    return {
        "nsys_1m_x8": overlap(lambda: nsys_export(folder, 1_000_000)),
        "nsys_10m_x8": overlap(lambda: nsys_export(folder, 10_000_000)),
        "kineto_1m": overlap(lambda: kineto_trace(folder, 1_000_000)),
        "report_h100": report(folder),
    }


def compiled(tree: Path) -> None:
    """The tree's packages compiled to bytecode (__pycache__), as a user's first run leaves them: without
    it (PYTHONDONTWRITEBYTECODE set, as on some machines) every run compiles some 80 modules, about 0.3 s,
    and the measurements time the compiler rather than the analysis."""
    packages = [str(tree / name) for name in ("analysis", "contract") if (tree / name).is_dir()]
    subprocess.run([sys.executable, "-m", "compileall", "-q", *packages], check=True)


def timed(tree: Path, args: list[str]) -> tuple[float, float, float]:
    """(wall s, CPU s, peak RSS MiB) of `python args` with PYTHONPATH at `tree`, in a fresh process that
    reads the tree's bytecode (compiled)."""
    env = {**os.environ, "PYTHONPATH": str(tree), "ANALYSIS_NO_CACHE": "1"}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    with tempfile.TemporaryFile() as err:  # a file, not a pipe: nothing reads while wait4 waits
        started = time.perf_counter()
        proc = subprocess.Popen([sys.executable, *args], cwd=tree, env=env, stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - started
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            err.seek(0)
            raise SystemExit(f"{tree}: python {' '.join(args)} failed ({proc.returncode}): {err.read().decode()}")
    # wait4's usage covers the process and its waited-for descendants; ru_maxrss is the largest (KiB)
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def change(before: float, after: float) -> str:
    return f"{100 * (after - before) / before:+.1f}%"


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def table(rows: list[tuple[str, dict]]) -> str:
    """One line per measurement: wall s and CPU s (median, range), peak RSS MiB (median); before, after, change."""
    head = ["measurement", "before wall s", "after wall s", "change", "before CPU s", "after CPU s", "change"]
    head += ["before MiB", "after MiB", "change"]
    lines = [head]
    for name, got in rows:
        line = [name]
        for i, number in ((0, spread), (1, spread), (2, lambda v: f"{statistics.median(v):.0f}")):
            values = {side: [run[i] for run in runs] for side, runs in got.items()}
            medians = [statistics.median(values[side]) for side in ("before", "after")]
            line += [number(values["before"]), number(values["after"]), change(*medians)]
        lines.append(line)
    widths = [max(len(line[c]) for line in lines) for c in range(len(head))]
    return "\n".join("  ".join(cell.rjust(w) for cell, w in zip(line, widths, strict=True)) for line in lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", type=Path, required=True, help="code tree before (a checkout or worktree)")
    ap.add_argument("--after", type=Path, default=REPO, help="code tree after (default this repository)")
    ap.add_argument("--only", action="append", help="run only this measurement (repeatable)")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each tree per measurement (default 3)")
    ap.add_argument("--inputs", type=Path, default=Path.home() / ".cache/ddp-overlap/headline", help="generated inputs")
    args = ap.parse_args(argv)
    if args.repeat < 1:
        ap.error("--repeat: at least 1")
    chosen = measurements(args.inputs)
    for name in args.only or []:
        if name not in chosen:
            ap.error(f"--only {name}: not one of {', '.join(chosen)}")
    trees = {"before": args.before.resolve(), "after": args.after.resolve()}
    for tree in trees.values():
        compiled(tree)
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for name, command in chosen.items():
            if args.only and name not in args.only:
                continue
            argv_ = command(Path(scratch))  # writes the inputs first, when missing
            got: dict[str, list[tuple[float, float, float]]] = {"before": [], "after": []}
            for i in range(args.repeat):
                for side in ("before", "after") if i % 2 == 0 else ("after", "before"):
                    got[side].append(timed(trees[side], argv_))
                    say(f"{name} {side}: " + "{:.2f} s, CPU {:.2f} s, {:.0f} MiB".format(*got[side][-1]))
            rows.append((name, got))
    print(table(rows))
    print(f"before {trees['before']}, after {trees['after']}: {args.repeat} runs each, in turns; cache off")
    return 0


if __name__ == "__main__":
    sys.exit(main())
