"""Comparison report across implementations, written into one folder and nowhere else.

    python -m analysis.report traces/*.sqlite -o reports/

Writes into the -o folder: index.html (ranking table, per-step breakdown, step spread, links),
timelines/<trace>.html (one per trace, opening on one step), timelines/side_by_side.html (one step
of every implementation, fastest first, on one time scale, backward outlined), plotly-<version>.min.js
(loaded by every page; --self-contained embeds it instead), summary.csv (one row per trace) and
results.db (SQLite: tables traces, ranks, steps keyed by trace path + content hash, so re-runs add
history without duplicating rows).
Refuses to overwrite files there that it did not write, and a report of other runs there unless
--overwrite (which removes that report's stale pages). Exit codes: 0 written, 2 bad input.
A veneer over the library: `open_runs(paths).report(folder)` (report/report_folder.py) writes the same.

    python -m analysis.report NEW... --baseline OLD... [--fail-if exposed_comm_ms:+10% ...] [--format json]

compares one run with a baseline instead (gate_command.py): per-metric deltas and a one-line verdict,
exit 1 when a --fail-if limit is passed; no folder is written.
"""

from __future__ import annotations

import argparse
import sys
from functools import partial
from pathlib import Path

import pandas as pd

from analysis import cli
from analysis.options import IMAGE_FORMATS, add_options
from analysis.render.table import print_frame
from analysis.report.report_files import SUMMARY_COLUMNS


def progress(message: str) -> None:
    print(f"[report] {message}", file=sys.stderr, flush=True)


def print_summary(summary: pd.DataFrame, fmt: str) -> None:
    """The summary rows; as a table without the hash, each run's notes under it (its design notes,
    trace/run_info.py, then missing ranks); JSON gives the design notes as `notes`, CSV leaves them out."""
    from analysis.trace.run_info import summary_notes

    shown = summary[SUMMARY_COLUMNS]
    design = summary_notes(summary)
    if fmt != "table":
        print_frame(shown.assign(notes=design) if fmt == "json" else shown, fmt, headings=False, indent=2)
        return
    print_frame(shown.drop(columns=["sha256", "ranks_note"]), fmt, headings=False, indent=2)
    for label, said, note in zip(summary["label"], design, summary["ranks_note"], strict=True):
        for line in [*said, *([note] if note else [])]:
            print(f"note: {label}: {line}")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m analysis.report",
        epilog=f"{cli.EXIT_STATUS[:-1]}; with --baseline, 1: a --fail-if limit passed. Progress goes to "
        "stderr; results.db is written by this process alone.",
        description="Compare implementations from nsys SQLite exports or torch.profiler JSON traces: "
        "writes index.html (ranking table, per-step time breakdown, step spread, timeline links), one "
        "timeline per trace, a side-by-side page (one step of each implementation), summary.csv and "
        "results.db into the -o folder, "
        "and nothing outside it. Prints the summary table.",
    )
    cli.add_input_options(ap, "one row each, ranked")
    ap.add_argument("-o", "--output", type=Path, default=Path("reports"), help="report folder (default reports/)")
    add_options(ap, ["format"], helps={"format": "summary output format (default table)"})
    ap.add_argument("--no-timelines", action="store_true", help="skip the timeline pages (faster)")
    ap.add_argument(
        "--overwrite",
        action="store_true",
        help="replace a report of other runs in the -o folder (refused without it), removing the pages and "
        "images it wrote that this report does not have; files this tool did not write are never touched",
    )
    ap.add_argument(
        "--peak-busbw",
        type=float,
        metavar="GBPS",
        help="draw this peak bus bandwidth (GB/s) on the Collectives section's bandwidth plot",
    )
    ap.add_argument(
        "--baseline",
        nargs="+",
        type=Path,
        metavar="OLD",
        help="compare instead: the traces are one new run (one file, or one run's per-rank files), OLD the "
        "baseline run; prints per-metric deltas and a verdict, writes no report folder",
    )
    ap.add_argument(
        "--fail-if",
        action="append",
        default=[],
        metavar="METRIC:LIMIT",
        help="with --baseline: exit 1 when METRIC regressed past LIMIT (+10%%: relative, +2: absolute in the "
        "metric's unit; + up, - down); repeatable, e.g. --fail-if exposed_comm_ms:+10%%",
    )
    ap.add_argument(
        "--self-contained",
        action="store_true",
        help="embed plotly.js in every page (+4.8 MB each) instead of writing plotly-<version>.min.js "
        "once into the folder",
    )
    images = {
        fmt: f"also write every figure as {fmt.upper()} into <output>/img/ (index_*, timeline_*, side_by_side), "
        "through kaleido and the system Chromium, offline; exit 2 with one line when they are missing"
        for fmt in IMAGE_FORMATS
    }
    add_options(ap, IMAGE_FORMATS, helps=images)
    return ap


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return cli.run(lambda: _run(args), no_cache=args.no_cache)


def _run(args: argparse.Namespace) -> int:
    from analysis.report.ranked_runs import hashed_file
    from analysis.report.report_folder import RunsFailed

    if args.baseline is not None or args.fail_if:
        from analysis.report.gate_command import run_gate  # the CI gate: compare two runs, write nothing

        return run_gate(args)
    task = partial(hashed_file, patterns=cli.patterns_from(args))  # files analysed in tasks come back hashed
    # the pages show neither the op/phase split nor the per-step view across ranks: not measured
    runs = cli.open_from_args(args, "[report]", task=task, needs_events=True, overlap_detail=False)
    try:
        result = runs.report(
            args.output,
            step=args.step,
            rank=args.rank,
            timelines=not args.no_timelines,
            peak_busbw=args.peak_busbw,
            self_contained=args.self_contained,
            images=[f for f in IMAGE_FORMATS if getattr(args, f)],
            progress=progress,
            overwrite=args.overwrite,
        )
    except RunsFailed as e:
        cli.report_failures(e.results)  # each failed run's error, one line each, as every CLI prints them
        return 2
    cli.emit(lambda: print_summary(result.summary, args.format))
    return 0


if __name__ == "__main__":
    sys.exit(main())
