"""Interactive HTML timeline of one or more traces, stacked on a shared time axis.

    python -m analysis.timeline traces/naive.sqlite traces/overlap.sqlite -o reports/naive_vs_overlap.html --step 3

One panel per trace, time zero at each trace's chosen step (or its first step); lanes per rank for
CPU NVTX phases, communication ranges and GPU streams; shading where communication overlaps
compute. The page loads plotly.js from plotly-<version>.min.js beside it (written once;
--self-contained embeds it instead) and opens offline. Exit status: 0 ok, 2 bad input.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from dataclasses import asdict
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go

from analysis import cli
from analysis.options import IMAGE_FORMATS, add_options
from analysis.render.export import Image, check_export, refuse_existing, write_images
from analysis.render.html_page import written_by_us
from analysis.render.table import print_frame
from analysis.timeline.figure import count_drawn_segments
from analysis.timeline.timeline_page import PanelSummary, check_output

DEFAULT_OUTPUT = Path("reports/timeline.html")


def progress(message: str) -> None:
    print(f"[timeline] {message}", file=sys.stderr, flush=True)


def print_rows(rows: list[PanelSummary], notes: list[str], design: list[list[str]], fmt: str) -> None:
    """The summary on stdout as an aligned table, CSV or JSON: one row per panel, the view it opens on, with
    each run's notes (missing ranks; design notes under the table and as JSON `notes`) and, where the panel
    opens on one step, the whole run's figures (a line under the table; JSON `whole_run`)."""
    columns = [c for c in PanelSummary.__annotations__ if c != "whole_run"]
    frame = pd.DataFrame([asdict(r) for r in rows], columns=columns)
    if fmt == "json":
        wholes = [r.whole_run for r in rows]
        print_frame(frame.assign(ranks_note=notes, notes=design, whole_run=wholes), fmt, headings=False, indent=2)
        return
    if fmt == "csv":
        print_frame(frame.assign(ranks_note=notes), fmt, headings=False)
        return
    print_frame(frame, fmt, headings=False)
    for row, note, said in zip(rows, notes, design, strict=True):
        if row.whole_run:
            print(f"{row.trace}: {whole_run_line(row.whole_run)}")
        for line in [*said, *([note] if note else [])]:
            print(f"note: {row.trace}: {line}")


def whole_run_line(whole: dict) -> str:
    """The whole run's figures, named, for the line under the table."""

    def ms(key: str) -> str:
        return "-" if whole[key] is None else f"{whole[key]:.2f} ms"

    pct = "-" if whole["overlap_pct"] is None else f"{whole['overlap_pct']:.1f}%"
    return (
        f"opens on the step above; behind 'whole run' ({whole['view']}, {whole['steps']} rank-steps, "
        f"{whole['segments']} segments): step {ms('step_ms')}, comm {ms('comm_ms')}, overlapped {pct}, "
        f"exposed comm {ms('exposed_comm_ms')}"
    )


def drawn_note(rows: list[PanelSummary], drawn: int) -> str:
    """What the page draws, in one phrase: its segments after merging, split into the views the panels
    open on (the summary's `segments`) and the whole runs behind the 'whole run' button."""
    opening = sum(r.segments for r in rows)
    said = f"{drawn} segments drawn, work narrower than a pixel merged"
    if drawn > opening:
        steps = "steps" if len(rows) > 1 else "step"
        return f"{said}: {opening} in the {steps} it opens on, {drawn - opening} behind 'whole run'"
    return said


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m analysis.timeline",
        epilog=f"{cli.EXIT_STATUS} Progress goes to stderr.",
        description="Write an interactive HTML timeline (opens offline) of nsys SQLite exports or "
        "torch.profiler JSON traces: one panel per run, stacked on a shared time axis, with lanes per "
        "rank for CPU NVTX phases, communication ranges and GPU streams, and shading where "
        "communication overlaps compute. "
        "Prints one summary row per panel.",
    )
    cli.add_input_options(ap, "one panel each, in this order")
    ap.add_argument("-o", "--output", type=Path, help="HTML file to write (default: reports/timeline.html)")
    ap.add_argument(
        "--width",
        type=int,
        default=1600,
        help="pixels across the full view; work narrower than one pixel is merged (default 1600)",
    )
    images = {
        fmt: f"also write <output>.{fmt}, --width pixels wide, through kaleido and the system Chromium, "
        f"offline (exit 2 with one line when they are missing or fail, or when a .{fmt} exists that does "
        "not pair with a page this tool wrote)"
        for fmt in IMAGE_FORMATS
    }
    add_options(ap, ["format", *IMAGE_FORMATS], helps={"format": "summary output format (default table)", **images})
    ap.add_argument(
        "--self-contained",
        action="store_true",
        help="embed plotly.js in the page (+4.8 MB) instead of loading it from "
        "plotly-<version>.min.js, written once beside the page",
    )
    return ap


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = build_parser()
    args = ap.parse_args(argv)
    if not 100 <= args.width <= 20000:
        ap.error(f"--width {args.width}: expected 100..20000 pixels")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return cli.run(lambda: _run(args), no_cache=args.no_cache)


def _run(args: argparse.Namespace) -> int:

    check_output(
        args.output or DEFAULT_OUTPUT,
        [Path(p) for p in args.paths],
        explicit=args.output is not None,
        self_contained=args.self_contained,
    )
    args.output = args.output or DEFAULT_OUTPUT
    formats = [f for f in IMAGE_FORMATS if getattr(args, f)]
    chromium = check_export(formats) if formats else ""  # no kaleido or Chromium: say so before any work
    image = Image(go.Figure(), args.output.with_suffix(""), args.width)
    refuse_existing([image], formats, ours=args.output.is_file() and written_by_us(args.output))
    runs = cli.open_from_args(args, "[timeline]", needs_events=True)
    if cli.report_failures(runs.results()):
        return 2  # each bad run's error is printed above; nothing is written
    page = runs.timeline(
        args.output, step=args.step, rank=args.rank, width_px=args.width, self_contained=args.self_contained
    )
    rows, notes, out, fig = page.panels, page.notes, page.path, page.figure
    progress(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB, {drawn_note(rows, count_drawn_segments(fig))})")
    if formats:
        written = write_images([dataclasses.replace(image, fig=fig)], formats, chromium)
        progress("wrote " + ", ".join(map(str, written)))
    cli.emit(lambda: print_rows(rows, notes, page.design_notes, args.format))
    return 0


if __name__ == "__main__":
    sys.exit(main())
