"""Re-make the screenshots of docs/reports.md (docs/img/*.png) from the real H100 traces and CPU runs.

    .venv/bin/python scripts/screenshots.py                  # every picture (records the CPU runs: ~2 min)
    .venv/bin/python scripts/screenshots.py --only gpu       # only the pictures of the H100 traces
    .venv/bin/python scripts/screenshots.py --cpu-traces DIR # CPU pictures from DIR/{naive,overlap}.sqlite

Builds each page with the project's own commands (analysis.report, analysis.timeline,
analysis.collectives --prefetch-chart) in a temporary folder, opens it in headless Chromium at
1400 px wide (tests/support/devtools.py), checks it as the browser tests do (data in every figure,
lanes >= 20 px, legends clear, no network request) and saves a PNG. Pages: a GPU timeline of one
step, the side-by-side page of naive and overlap_bucket, the report's first screen, its collectives
section and its side-by-side page (the five H100 runs of ../shared/data/gpu_h100); a CPU run's naive
vs overlap timeline
(run_nsys.sh); the prefetch chart of PyTorch FSDP2 recorded with plain torch.profiler
(scripts/record_torch_fsdp2.py). Exit 0 when every picture was made and passed its checks, 1 when
a check failed (the PNG is still written), 2 when an input is missing.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import lzma
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from analysis.collectives import command as collectives  # noqa: E402
from analysis.report import command as report  # noqa: E402
from analysis.report.compare_page import PAGE_NAME as COMPARE_PAGE  # noqa: E402
from analysis.timeline import command as timeline  # noqa: E402
from tests.support.devtools import Browser  # noqa: E402
from tests.support.page_layout import inspect, problems  # noqa: E402

GPU_DATA = REPO / ".." / "shared" / "data" / "gpu_h100"
GPU_RUNS = ("naive", "flat", "overlap", "overlap_bucket", "torch")
WIDTH, FIRST_SCREEN = 1400, 1000


@dataclass(frozen=True)
class Shot:
    """One picture: the page to make (returns its path) and how much of it to keep."""

    name: str
    group: str  # gpu | cpu | fsdp
    make: Callable[[Path], Path]
    region: str = "page"  # page: the whole page; screen: the first 1400 x 1000; h2:<heading>: 1000 px from it


def say(message: str) -> None:
    print(f"[screenshots] {message}", file=sys.stderr, flush=True)


def decompress_gpu(into: Path) -> Path:
    """The five H100 runs, decompressed into `into`."""
    into.mkdir(parents=True, exist_ok=True)
    for name in GPU_RUNS:
        with lzma.open(GPU_DATA / f"{name}.sqlite.xz") as src, open(into / f"{name}.sqlite", "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
    return into


def record_cpu(into: Path) -> Path:
    """naive and overlap on two CPU ranks under nsys, 3 measured steps (run_nsys.sh)."""
    cmd = ["bash", str(REPO / "run_nsys.sh"), "naive", "overlap", "--gpus", "0", "-o", str(into.resolve())]
    cmd += ["--steps", "3", "--warmup", "1", "--batch-size", "8", "--context-length", "64"]
    subprocess.run(cmd, check=True, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return into


def record_fsdp2(into: Path) -> Path:
    """PyTorch FSDP2 on two CPU ranks recorded with plain torch.profiler (none of this project's code)."""
    cmd = [sys.executable, "-W", "ignore", str(REPO / "scripts/record_torch_fsdp2.py"), "--profiler", "torch"]
    cmd += ["-o", str(into.resolve()), "--steps", "3", "--layers", "2"]
    subprocess.run(cmd, check=True, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return into


def run_cli(main: Callable[[list[str]], int], args: list[str]) -> None:
    """One of the project's commands, quiet; its output is shown only when it fails."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(args)
    if code != 0:
        raise SystemExit(f"error: {main.__module__} {' '.join(args)} exited with {code}: {err.getvalue()[-500:]}")


def shots(inputs: Callable[[str], Path]) -> list[Shot]:
    """The pictures; `inputs(group)` gives the (relative) folder of a group's traces, made on first use."""

    reports: dict[str, Path] = {}  # each report made once per run, photographed more than once

    def gpu_report(runs: tuple[str, ...], folder: str) -> Path:
        if folder not in reports:
            shutil.rmtree(folder, ignore_errors=True)  # a folder of this run's work dir: no stale pages
            run_cli(report.main, [*(str(inputs("gpu") / f"{name}.sqlite") for name in runs), "-o", folder])
            reports[folder] = Path(folder)
        return reports[folder]

    def five_runs(page: str) -> Callable[[Path], Path]:
        return lambda _: gpu_report(GPU_RUNS, "h100_report") / page

    def naive_vs_overlap_bucket(_: Path) -> Path:
        return gpu_report(("naive", "overlap_bucket"), "h100_naive_vs_overlap_bucket") / COMPARE_PAGE

    def gpu_step(out: Path) -> Path:  # opens on the representative step (closest to the medians)
        run_cli(timeline.main, [str(inputs("gpu") / "overlap_bucket.sqlite"), "-o", str(out)])
        return out

    def cpu_side_by_side(out: Path) -> Path:
        traces = [str(inputs("cpu") / f"{name}.sqlite") for name in ("naive", "overlap")]
        run_cli(timeline.main, [*traces, "-o", str(out)])
        return out

    def prefetch(out: Path) -> Path:
        ranks = [str(inputs("fsdp") / f"fsdp2.rank{r}.json") for r in (0, 1)]
        run_cli(collectives.main, [*ranks, "--merge", "--prefetch-chart", str(out)])
        return out

    return [
        Shot("timeline_gpu_step", "gpu", gpu_step),
        Shot("side_by_side_naive_vs_overlap_bucket", "gpu", naive_vs_overlap_bucket),
        Shot("report_first_screen", "gpu", five_runs("index.html"), region="screen"),
        Shot("report_collectives", "gpu", five_runs("index.html"), region="h2:Collectives"),
        Shot("report_side_by_side", "gpu", five_runs(COMPARE_PAGE)),
        Shot("timeline_cpu_naive_vs_overlap", "cpu", cpu_side_by_side),
        Shot("prefetch_chart_fsdp2", "fsdp", prefetch),
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="scripts/screenshots.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("-o", "--output", type=Path, default=REPO / "docs" / "img", help="folder of the PNGs")
    ap.add_argument("--only", choices=("gpu", "cpu", "fsdp"), action="append", help="only these groups")
    ap.add_argument("--cpu-traces", type=Path, help="folder with naive.sqlite and overlap.sqlite (else recorded)")
    ap.add_argument(
        "--work",
        type=Path,
        help="keep the traces and pages in this folder and reuse the traces found there on the next run "
        "(default: a temporary folder)",
    )
    args = ap.parse_args(argv)
    if args.cpu_traces is not None:
        args.cpu_traces = args.cpu_traces.resolve()
        missing = [n for n in ("naive", "overlap") if not (args.cpu_traces / f"{n}.sqlite").is_file()]
        if missing:
            print(f"error: --cpu-traces {args.cpu_traces}: no {missing[0]}.sqlite there", file=sys.stderr)
            return 2
    groups = set(args.only or ("gpu", "cpu", "fsdp"))
    if "gpu" in groups and not GPU_DATA.is_dir():
        print(f"error: {GPU_DATA} not found (the H100 traces)", file=sys.stderr)
        return 2
    args.output.mkdir(parents=True, exist_ok=True)
    failed = 0
    output = args.output.resolve()
    makers: dict[str, Callable[[Path], Path]] = {"gpu": decompress_gpu, "cpu": record_cpu, "fsdp": record_fsdp2}
    made: dict[str, Path] = {}

    def inputs(group: str) -> Path:
        if group not in made and Path(group).is_dir() and any(Path(group).iterdir()):
            made[group] = Path(group)  # kept from an earlier run (--work)
        if group not in made:
            if group == "cpu" and args.cpu_traces:
                Path("cpu").mkdir()
                for name in ("naive", "overlap"):
                    Path("cpu", f"{name}.sqlite").symlink_to((args.cpu_traces / f"{name}.sqlite").resolve())
            else:
                say(f"making the {group} traces")
                makers[group](Path(group))
            made[group] = Path(group)
        return made[group]

    here = Path.cwd()
    with contextlib.ExitStack() as stack:
        work = args.work.resolve() if args.work else Path(stack.enter_context(tempfile.TemporaryDirectory()))
        work.mkdir(parents=True, exist_ok=True)
        b = stack.enter_context(Browser(width=WIDTH, height=FIRST_SCREEN))
        os.chdir(work)  # the pages show the traces' paths: short relative ones read best
        try:
            for shot in shots(inputs):
                if shot.group not in groups:
                    continue
                page = shot.make(Path(f"{shot.name}.html"))
                png = output / f"{shot.name}.png"
                found = problems(inspect(b, page, screenshot=png, region=shot.region))
                say(f"wrote {png} ({png.stat().st_size / 1e3:.0f} kB)" + (f"; problems: {found}" if found else ""))
                failed += bool(found)
        finally:
            os.chdir(here)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
