"""Comparison report across implementations, written into one folder and nowhere else.

    python -m analysis.report traces/*.sqlite -o reports/

Writes into the -o folder: index.html (ranking table, per-step breakdown, step spread, links),
timelines/<trace>.html (one per trace, opening on one step), timelines/side_by_side.html (one step
of every implementation, fastest first, on one time scale, backward outlined), plotly-<version>.min.js
(loaded by every page; --self-contained embeds it instead), summary.csv (one row per trace) and
results.db (SQLite: tables traces, ranks, steps keyed by trace path + content hash, so re-runs add
history without duplicating rows).
Refuses to overwrite files there that it did not write. Exit codes: 0 written, 2 bad input.

    python -m analysis.report NEW... --baseline OLD... [--fail-if exposed_comm_ms:+10% ...] [--format json]

compares one run with a baseline instead (report_gate.py): per-metric deltas and a one-line verdict,
exit 1 when a --fail-if limit is passed; no folder is written.
"""

from __future__ import annotations

import argparse
import sys
import time
from functools import partial
from pathlib import Path

import pandas as pd

from analysis import cli
from analysis.engine.report_runs import AnalyzedTrace, analyze_all, steps_frame, summary_frame
from analysis.engine.session import OpenRuns
from analysis.errors import TraceError
from analysis.views.compare_page import PAGE_NAME as COMPARE_PAGE
from analysis.views.export import Image, check_export, refuse_existing, write_images
from analysis.views.html_page import BESIDE_THE_PAGE, PlotlyJs
from analysis.views.html_report import write_index
from analysis.views.lanes import Selection
from analysis.views.report_files import SUMMARY_COLUMNS, check_out_dir, record_history
from analysis.views.table import print_frame

FORMATS = ("table", "csv", "json")
FORMATS_IMG = ("png", "svg")  # --png / --svg
IMAGES = "img"  # the report folder's image subfolder
TIMELINE_PX = 1600  # image width of the timeline pages (the index's figures: export.DEFAULT_WIDTH_PX)


def progress(message: str) -> None:
    print(f"[report] {message}", file=sys.stderr, flush=True)


def timeline_names(traces: list[tuple[str, str]]) -> dict[str, str]:
    """timelines/<name>.html per (label, name) of a trace, numbered when two traces share a name."""
    names: dict[str, str] = {}
    seen: dict[str, int] = {}
    for label, name in traces:
        n = seen.get(name, 0)
        seen[name] = n + 1
        names[label] = f"timelines/{name}{'' if n == 0 else f'_{n}'}.html"
    return names


def write_timelines(
    out: Path,
    runs: OpenRuns,
    results: list[AnalyzedTrace],
    summary: pd.DataFrame,
    selection: Selection,
    plotly_js: PlotlyJs = BESIDE_THE_PAGE,
) -> tuple[dict, str | None, list[Image]]:
    """One overview timeline per trace and, with two traces or more, the side-by-side page (one step of
    each, fastest first); returns the per-trace links, the side-by-side page's name (or None) and the
    pages' figures as images to export (img/<page name>)."""
    from analysis.views.compare_page import compare_panel, write_compare
    from analysis.views.html_report import label_colours
    from analysis.views.timeline_page import trace_panel, write_timeline

    names = timeline_names([(r.path, r.name) for r in results])
    labels = dict(zip(summary["trace"], summary["label"], strict=True))
    colours = label_colours(summary)
    compared = {}
    images = []
    for r in results:
        t0 = time.perf_counter()
        trace = runs.trace(r.index)
        label = labels[str(r.path)]
        panel, _ = trace_panel(
            r.path, selection, trace=trace, steps=r.analysis.steps, patterns=runs.patterns, colour=colours[label]
        )
        _, fig = write_timeline(
            [panel], out / names[r.path], f"Timeline: {trace.implementation}", selection, plotly_js=plotly_js
        )
        images.append(Image(fig, out / IMAGES / ("timeline_" + Path(names[r.path]).stem), TIMELINE_PX))
        if len(results) > 1:
            compared[label] = compare_panel(label, colours[label], r.path, trace, r.analysis.steps, runs.patterns)
        progress(f"timeline of {r.path} ({time.perf_counter() - t0:.1f} s)")
    if not compared:
        return names, None, images
    order = [x for x in summary["label"] if x in compared]  # fastest first
    _, fig = write_compare(out / COMPARE_PAGE, [compared[x] for x in order], order, plotly_js)
    images.append(Image(fig, out / IMAGES / Path(COMPARE_PAGE).stem, TIMELINE_PX))
    return names, COMPARE_PAGE, images


def collectives_blocks(
    runs: OpenRuns,
    results: list[AnalyzedTrace],
    summary: pd.DataFrame,
    peak_busbw: float | None,
    args: argparse.Namespace,
) -> list:
    """The index page's Collectives section (views/report_collectives.py), one entry per run, fastest
    first, from the same loaded runs."""
    from analysis.views.html_report import label_colours
    from analysis.views.report_collectives import CollectivesEntry, collectives_section

    by_trace = {str(r.path): r for r in results}
    colours = label_colours(summary)
    view = runs.collectives(rank=args.rank, step=args.step)
    entries = []
    for path, label in zip(summary["trace"], summary["label"], strict=True):  # one per run
        r = by_trace[path]
        mine = view.only(r.analysis.summary["path"].iloc[0])
        entries.append(CollectivesEntry(label, runs.trace(r.index), mine, r.analysis.steps, colours[label]))
    return collectives_section(entries, peak_busbw, runs.patterns)


def print_summary(summary: pd.DataFrame, fmt: str) -> None:
    """The summary rows; as a table without the hash, each run's note (missing ranks) under it."""
    shown = summary[SUMMARY_COLUMNS]
    if fmt != "table":
        print_frame(shown, fmt, headings=False, indent=2)
        return
    print_frame(shown.drop(columns=["sha256", "ranks_note"]), fmt, headings=False, indent=2)
    for label, note in zip(summary["label"], summary["ranks_note"], strict=True):
        if note:
            print(f"note: {label}: {note}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
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
    ap.add_argument("--format", choices=FORMATS, default="table", help="summary output format (default table)")
    ap.add_argument("--no-timelines", action="store_true", help="skip the timeline pages (faster)")
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
    for fmt in FORMATS_IMG:
        ap.add_argument(
            f"--{fmt}",
            action="store_true",
            help=f"also write every figure as {fmt.upper()} into <output>/img/ (index_*, timeline_*, side_by_side), "
            "through kaleido and the system Chromium, offline; exit 2 with one line when they are missing",
        )
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return cli.run(lambda: _run(args))


def _run(args: argparse.Namespace) -> int:
    from analysis.engine.report_runs import hashed_file

    if args.baseline is not None or args.fail_if:
        from analysis.report_gate import run_gate  # the CI gate: compare two runs, write nothing

        return run_gate(args)
    out, patterns = args.output, cli.patterns_from(args)
    if args.peak_busbw is not None and not args.peak_busbw > 0:
        raise TraceError(f"--peak-busbw {args.peak_busbw}: must be a positive number of GB/s")
    runs = cli.open_from_args(args, "[report]", task=partial(hashed_file, patterns=patterns), needs_events=True)
    pages = [] if args.no_timelines else list(timeline_names([(r.label, r.name) for r in runs.runs]).values())
    if pages and len(runs.runs) > 1:
        pages.append(COMPARE_PAGE)
    check_out_dir(out, pages, args.self_contained)  # fail before the (slow) analysis when we can
    formats = [f for f in FORMATS_IMG if getattr(args, f)]
    chromium = check_export(formats) if formats else ""  # no kaleido or Chromium: say so before the analysis
    results, bad = analyze_all(runs, args.step, args.rank)
    if bad:
        return 2  # each bad file's error is printed above; nothing is written
    summary = summary_frame(results)
    check_out_dir(out, pages, args.self_contained)  # every output, before writing any
    ours = (out / "index.html").is_file()  # check_out_dir let it pass: the folder is a report of ours
    out.mkdir(parents=True, exist_ok=True)
    record_history(out / "results.db", results, summary)  # first: the one that can refuse late
    selection = Selection(step=args.step, rank=args.rank)
    plotly_js = PlotlyJs(self_contained=args.self_contained, folder=out)
    links, side, images = (
        ({}, None, []) if args.no_timelines else write_timelines(out, runs, results, summary, selection, plotly_js)
    )
    index, figures = write_index(
        out / "index.html",
        summary,
        steps_frame(results, summary),
        links,
        (side, "Side by side: " + ", ".join(summary["label"])) if side else None,
        collectives_blocks(runs, results, summary, args.peak_busbw, args),
        plotly_js,
    )
    summary[SUMMARY_COLUMNS].to_csv(out / "summary.csv", index=False)
    progress(f"wrote {out / 'results.db'}, {index}, {out / 'summary.csv'}")
    if formats:
        images += [Image(f, out / IMAGES / f"index_{f.layout.meta['image']}") for f in figures]
        refuse_existing(images, formats, ours)
        t0 = time.perf_counter()
        written = write_images(images, formats, chromium)
        progress(f"wrote {len(written)} images into {out / IMAGES} ({time.perf_counter() - t0:.1f} s)")
    cli.emit(lambda: print_summary(summary, args.format))
    return 0


if __name__ == "__main__":
    sys.exit(main())
