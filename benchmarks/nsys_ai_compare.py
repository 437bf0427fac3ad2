"""Time `python -m analysis.overlap` beside nsys-ai 0.3.0's overlap skill on the same exports, cold and warm.

The question both answer: how much communication overlapped compute. Ours:
`python -m analysis.overlap FILE` (every rank, per step and whole run). nsys-ai:
`nsys-ai skill run overlap_breakdown FILE --format json` (one GPU per call, device 0 by default: compute-only,
NCCL-only, overlap and idle ms over the capture). nsys-ai is called as a tool from its own virtualenv
(--venv), with NSYS_AI_DUCKDB_THREADS=1 and HOME pointing at a folder whose .duckdb/extensions holds the
sqlite_scanner of the PyPI package duckdb-ext-sqlite, so DuckDB loads it offline (without it, nsys-ai falls
back to plain SQLite and writes its indexes into the export).

Every run works on a COPY of the export in a temporary folder (nsys-ai writes beside the file, or into it):
cold = a fresh copy in a fresh folder (nothing cached; the run builds whatever cache the tool keeps), warm =
another run on the same copy after a first. Each run is a fresh process; wall time, CPU time (user + sys,
from wait4) and peak RSS are recorded, best and median of --repeat runs printed, with the load average
before and after (the machine is shared: CPU time is the steadier figure). The sha256 of the copy before and
after each tool's runs says whether the tool changed the user's file.

    python benchmarks/nsys_ai_compare.py                                   # H100 overlap export + 1M x 8
    python benchmarks/nsys_ai_compare.py --repeat 5 --format json
    python benchmarks/nsys_ai_compare.py --exports /tmp/gpu_h100/overlap.sqlite
    python benchmarks/nsys_ai_compare.py --repos . ../wt-cache    # two checkouts of ours beside nsys-ai

Setup of nsys-ai (once; PyPI):
    python3 -m venv ~/.cache/ddp-overlap/nsys-ai-venv
    ~/.cache/ddp-overlap/nsys-ai-venv/bin/pip install nsys-ai==0.3.0 duckdb==1.4.4 duckdb-ext-sqlite==1.4.4.20260205
"""

from __future__ import annotations

import argparse
import hashlib
import json
import lzma
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CACHE = Path.home() / ".cache" / "ddp-overlap"
H100_XZ = REPO.parent / "shared" / "data" / "gpu_h100" / "overlap.sqlite.xz"
DEFAULT_EXPORTS = [Path("/tmp/gpu_h100/overlap.sqlite"), Path("/tmp/bench/ddp_1000000k8r.sqlite")]
DUCKDB = "v1.4.4/linux_amd64"  # the duckdb version nsys-ai 0.3.0 is installed with, and its platform


def say(line: str) -> None:
    print(f"[nsys_ai_compare] {line}", file=sys.stderr, flush=True)


def sha256(path: Path) -> str:
    """The file's sha256, hex."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def nsys_ai_env(venv: Path) -> dict[str, str]:
    """The environment nsys-ai runs in: one DuckDB thread, a HOME whose DuckDB extension folder holds the
    sqlite_scanner shipped by duckdb-ext-sqlite (DuckDB would otherwise try to download it)."""
    shipped = next(
        venv.glob(f"lib/python*/site-packages/duckdb_ext/extensions/{DUCKDB}/sqlite_scanner.duckdb_extension")
    )
    home = venv.parent / "nsys-ai-home"
    link = home / ".duckdb" / "extensions" / DUCKDB / shipped.name
    if not link.exists():
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(shipped)
    return {**os.environ, "HOME": str(home), "NSYS_AI_DUCKDB_THREADS": "1"}


def head(repo: Path) -> str:
    """The short commit that last changed the checkout's analysis/ (the code timed), for the tool's label."""
    git = ["git", "-C", str(repo), "log", "-1", "--format=%h", "--", "analysis"]
    out = subprocess.run(git, capture_output=True, text=True)
    return out.stdout.strip() or repo.name


def commands(venv: Path, repos: list[Path], with_nsys_ai: bool) -> dict[str, tuple[list[str], dict[str, str]]]:
    """Each tool's command (the export's path appended) and environment: ours once per checkout in repos
    (its code first on PYTHONPATH; ANALYSIS_NO_CACHE dropped, as a user's shell has it), then nsys-ai."""
    ours_env = {k: v for k, v in os.environ.items() if k != "ANALYSIS_NO_CACHE"}
    tools = {
        f"ours@{head(r)}": ([sys.executable, "-m", "analysis.overlap"], {**ours_env, "PYTHONPATH": str(r)})
        for r in repos
    }
    if with_nsys_ai:
        theirs = [str(venv / "bin" / "nsys-ai"), "skill", "run", "overlap_breakdown", "--format", "json"]
        tools["nsys-ai"] = (theirs, nsys_ai_env(venv))
    return tools


def one_run(command: list[str], env: dict[str, str], cwd: Path) -> dict:
    """Wall s, CPU s and peak RSS MB of one process; exits when it fails."""
    started = time.perf_counter()
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - started
        if os.waitstatus_to_exitcode(status) != 0:
            err.seek(0)
            raise SystemExit(f"{' '.join(command)} failed: {err.read().decode(errors='replace')[-2000:]}")
    return {"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime, "rss_mb": usage.ru_maxrss / 1024}


def fresh_copy(export: Path, folder: Path) -> Path:
    """The export copied (mtime kept) into `folder`, made anew."""
    folder.mkdir(parents=True)
    return Path(shutil.copy2(export, folder / export.name))


def measure(export: Path, tools: dict[str, tuple[list[str], dict[str, str]]], repeat: int, scratch: Path) -> dict:
    """Per tool: cold runs (a fresh copy each) and warm runs (on the first cold run's copy), the tools
    alternating run by run so that a change in the machine's load falls on both."""
    result: dict = {t: {"cold": [], "warm": [], "export_changed": False} for t in tools}
    first: dict[str, tuple[Path, str]] = {}
    for k in range(repeat):
        for tool, (command, env) in tools.items():
            say(f"{tool} cold {k + 1}/{repeat} on {export.name}")
            copy = fresh_copy(export, scratch / tool / f"copy{k}")
            before = sha256(copy)
            result[tool]["cold"].append(one_run([*command, copy.name], env, copy.parent))
            if k == 0:  # kept for the warm runs, with its cache built by this cold run
                first[tool] = copy, before
            else:
                result[tool]["export_changed"] |= sha256(copy) != before
                shutil.rmtree(copy.parent)
    for j in range(repeat):
        for tool, (command, env) in tools.items():
            say(f"{tool} warm {j + 1}/{repeat} on {export.name}")
            copy = first[tool][0]
            result[tool]["warm"].append(one_run([*command, copy.name], env, copy.parent))
    for tool, (copy, before) in first.items():
        result[tool]["export_changed"] |= sha256(copy) != before
        result[tool]["written_beside"] = sorted(p.name for p in copy.parent.iterdir() if p.name != export.name)
        shutil.rmtree(copy.parent)
    return result


def summary(runs: list[dict], key: str) -> tuple[float, float]:
    """(best, median) of one figure."""
    values = [r[key] for r in runs]
    return min(values), statistics.median(values)


def rows(results: dict) -> list[dict]:
    """One row per export, tool and look (cold, warm)."""
    out = []
    for export, tools in results.items():
        for tool, r in tools.items():
            for look in ("cold", "warm"):
                wall, cpu, rss = (summary(r[look], k) for k in ("wall_s", "cpu_s", "rss_mb"))
                out.append({
                    "export": export, "tool": tool, "look": look, "runs": len(r[look]),
                    "wall_best_s": round(wall[0], 3), "wall_median_s": round(wall[1], 3),
                    "cpu_best_s": round(cpu[0], 3), "cpu_median_s": round(cpu[1], 3),
                    "peak_rss_mb": round(rss[1]), "export_changed": r["export_changed"],
                    "written_beside": " ".join(r["written_beside"]) or "-",
                })  # fmt: skip
    return out


def exports_from(paths: list[Path] | None, scratch: Path) -> list[Path]:
    """The exports to time; the H100 overlap export is decompressed from ../shared/data when absent."""
    found = []
    for path in paths or DEFAULT_EXPORTS:
        if path.exists():
            found.append(path)
        elif path == DEFAULT_EXPORTS[0] and H100_XZ.exists():
            target = scratch / "source" / path.name
            target.parent.mkdir(exist_ok=True)
            with lzma.open(H100_XZ) as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
            found.append(target)
        elif path == DEFAULT_EXPORTS[1]:
            raise SystemExit(
                f"error: {path} is absent: python benchmarks/analysis_speed.py --sizes 1000000 --keep /tmp/bench"
            )
        else:
            raise SystemExit(f"error: {path}: no such file")
    return found


def print_table(table: list[dict]) -> None:
    cols = list(table[0])
    width = {c: max(len(c), *(len(str(r[c])) for r in table)) for c in cols}
    print("  ".join(c.rjust(width[c]) for c in cols))
    for r in table:
        print("  ".join(str(r[c]).rjust(width[c]) for c in cols))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--exports", nargs="+", type=Path, help="exports to time (default: H100 overlap, 1M x 8)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per tool, export and look (default 3)")
    parser.add_argument("--venv", type=Path, default=CACHE / "nsys-ai-venv", help="nsys-ai 0.3.0's virtualenv")
    parser.add_argument(
        "--repos", nargs="+", type=Path, default=[REPO], help="checkouts of ours to time (default: this)"
    )
    parser.add_argument("--no-nsys-ai", action="store_true", help="time ours only")
    parser.add_argument("--format", choices=("table", "csv", "json"), default="table")
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error(f"--repeat {args.repeat}: must be >= 1")
    if not args.no_nsys_ai and not (args.venv / "bin" / "nsys-ai").exists():
        raise SystemExit(f"error: no nsys-ai in {args.venv} (see this script's docstring for the setup)")
    load_before = os.getloadavg()
    results: dict = {}
    with tempfile.TemporaryDirectory(prefix="nsys-ai-compare-") as tmp:
        scratch = Path(tmp)
        tools = commands(args.venv, [r.resolve() for r in args.repos], not args.no_nsys_ai)
        for export in exports_from(args.exports, scratch):
            label = f"{export.name} ({export.stat().st_size / 1e6:.1f} MB)"
            results[label] = measure(export, tools, args.repeat, scratch)
    load = {"before": [round(x, 2) for x in load_before], "after": [round(x, 2) for x in os.getloadavg()]}
    table = rows(results)
    if args.format == "json":
        print(json.dumps({"rows": table, "runs": results, "load_average": load}, indent=1))
    elif args.format == "csv":
        print(",".join(table[0]))
        for r in table:
            print(",".join(str(v) for v in r.values()))
    else:
        print_table(table)
        print(f"load average (1, 5, 15 min) before {load['before']}, after {load['after']}; {os.cpu_count()} cores")
    return 0


if __name__ == "__main__":
    sys.exit(main())
