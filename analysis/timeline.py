"""Interactive HTML timeline of one or more traces, stacked on a shared time axis.

    python -m analysis.timeline traces/naive.sqlite traces/overlap.sqlite -o reports/naive_vs_overlap.html --step 3

One panel per trace, time zero at each trace's chosen step (or its first step); lanes per rank for
CPU NVTX phases, communication ranges and GPU streams; shading where communication overlaps
compute. The page embeds plotly.js and opens offline. Exit codes: 0 written, 2 bad input.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import plotly.graph_objects as go

from analysis.errors import TraceError
from analysis.html_page import write_page, written_by_us
from analysis.lanes import Selection, build_panel
from analysis.render_figure import Panel, build_figure, count_drawn_segments

if TYPE_CHECKING:
    import pandas as pd

    from analysis.trace import Trace

FORMATS = ("table", "csv", "json")
DEFAULT_OUTPUT = Path("reports/timeline.html")
# run_nsys.sh --per-rank: <impl>.rank<N>.sqlite; --profiler torch: <impl>.rank<N>.json.gz
RANK_FILE = re.compile(r"^(?P<run>.+)\.rank\d+(?:\.json)?$")


@dataclass(frozen=True)
class TraceInput:
    """One trace to draw: a single export, or the one-rank exports of a per-rank run (merged on load)."""

    name: str  # file stem, or <impl> of <impl>.rank<N>.sqlite
    paths: tuple[Path, ...]

    @property
    def label(self) -> str:
        if len(self.paths) == 1:
            return str(self.paths[0])
        suffix = re.sub(r"^.*\.rank\d+", "", self.paths[0].name)  # .sqlite, .json.gz, ...
        return str(self.paths[0].parent / f"{self.name}.rank*{suffix}") + f" ({len(self.paths)} files)"


def group_inputs(paths: list[Path]) -> list[TraceInput]:
    """Each path is a trace, except `<run>.rank<N>.*` files of one folder, which form one trace."""
    groups: dict[tuple, list[Path]] = {}
    for path in paths:  # a handful of command-line paths
        found = RANK_FILE.match(path.stem)
        key = (str(path.parent), found["run"]) if found else (str(path),)
        groups.setdefault(key, []).append(path)
    return [TraceInput(k[1] if len(k) == 2 else g[0].stem.removesuffix(".json"),  # k[1]: the run of rank files
                       tuple(g))
            for k, g in groups.items()]


@dataclass(frozen=True)
class PanelSummary:
    """One row of the CLI's machine-readable output: a panel and the analysis figures in its title."""

    trace: str
    implementation: str
    view: str
    ranks: int
    steps: int
    segments: int
    step_ms: float | None
    comm_ms: float | None
    overlap_pct: float | None
    exposed_comm_ms: float | None


def progress(message: str) -> None:
    print(f"[timeline] {message}", file=sys.stderr, flush=True)


def view_name(selection: Selection) -> str:
    step = "all steps" if selection.step is None else f"step {selection.step}"
    rank = "all ranks" if selection.rank is None else f"rank {selection.rank}"
    return f"{step}, {rank}"


def analysis_figures(trace: Trace, selection: Selection, steps: pd.DataFrame | None = None) -> dict:
    """The analysis's metrics (metrics.py) for the selected step/rank, averaged over steps and ranks.

    `steps`: the trace's per-step frame when the caller already analysed it (else it is computed)."""
    from analysis.metrics import summarise
    from analysis.overlap import analyze_trace

    steps = analyze_trace(trace).steps if steps is None else steps
    if selection.rank is not None:
        steps = steps.loc[steps["rank"] == selection.rank]
    if selection.step is not None:
        steps = steps.loc[steps["step"] == selection.step]
    return summarise(steps)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} ms"


def panel_title(implementation: str, path: str, selection: Selection, fig: dict) -> str:
    """Implementation, file, view and the analysis's overlap figures (mean per step and rank)."""
    pct = "-" if fig.get("overlap_pct") is None else f"{fig['overlap_pct']:.1f}%"
    return (f"<b>{implementation}</b> — {Path(path).name} — {view_name(selection)} — step {_ms(fig.get('step_ms'))},"
            f" comm {_ms(fig.get('comm_ms'))}, overlapped {pct}, exposed comm {_ms(fig.get('exposed_comm_ms'))}")


def trace_panel(path: str | Path, selection: Selection, trace: Trace | None = None, width_px: int = 1600,
                steps: pd.DataFrame | None = None) -> tuple[Panel, PanelSummary]:
    """Load a trace (unless given) and build its panel plus the summary row; `steps` reuses an
    existing analysis of the trace (analyze_trace(trace).steps) instead of measuring it again."""
    from analysis.trace import load_trace  # deferred: --help stays instant

    trace = trace if trace is not None else load_trace(path)
    fig = analysis_figures(trace, selection, steps)
    title = panel_title(trace.implementation, str(path), selection, fig)
    panel = build_panel(trace, selection, title=title, width_px=width_px)
    summary = PanelSummary(str(path), trace.implementation, view_name(selection), fig["ranks"], fig["steps"],
                           len(panel.segments), fig["step_ms"], fig["comm_ms"], fig["overlap_pct"],
                           fig["exposed_comm_ms"])
    return panel, summary


def write_timeline(panels: list[Panel], output: Path, title: str, selection: Selection,
                   width_px: int = 1600) -> tuple[Path, go.Figure]:
    """Write the stacked-panel page; returns its path and the figure."""
    x_title = ("time since the step's start (ms)" if selection.step is not None
               else "time since the first step's start (ms; trace start when there are no steps)")
    fig = build_figure(panels, width_px=width_px, x_title=x_title)
    intro = ("Lanes per rank: CPU NVTX ranges (step, phases, communication), then per GPU stream its compute "
             "and communication work. Green shading: communication overlapping compute. Work narrower than a "
             "pixel at full view is merged into blocks (the hover gives the count); zoom with the mouse.")
    write_page(output, title, [fig], intro=intro)
    return output, fig


def check_output(output: Path, inputs: list[Path], explicit: bool = True) -> None:
    """Refuse outputs that would clobber an input or are not HTML; without an explicit -o, also any
    existing page this tool did not write."""
    if output.suffix.lower() not in (".html", ".htm"):
        raise TraceError(f"-o {output}: the timeline is an HTML page; give a path ending in .html")
    if output.exists() and output.is_dir():
        raise TraceError(f"-o {output}: is a directory; give a file path ending in .html")
    if any(output.resolve() == p.resolve() for p in inputs):
        raise TraceError(f"-o {output}: is one of the input traces; refusing to overwrite it")
    if not explicit and output.is_file() and not written_by_us(output):
        raise TraceError(f"{output}: exists and was not written by this tool; pass -o to choose the output")


def print_rows(rows: list[PanelSummary], fmt: str) -> None:
    """The summary on stdout as an aligned table, CSV or JSON."""
    data = [asdict(r) for r in rows]
    if fmt == "json":
        print(json.dumps(data, indent=2))
        return
    cols = list(data[0]) if data else []
    cells = [[f"{v:.3f}" if isinstance(v, float) else ("" if v is None else str(v)) for v in d.values()]
             for d in data]
    if fmt == "csv":
        import csv

        writer = csv.writer(sys.stdout)
        writer.writerow(cols)
        writer.writerows(cells)
        return
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(cols)]
    for line in [cols, *cells]:
        print("  ".join(v.rjust(w) if i else v.ljust(w) for i, (v, w) in enumerate(zip(line, widths, strict=True))))


def png_refusal(output: Path) -> str:
    """Why `<output>.png` must not be written, or ''. An existing PNG is replaced only when it pairs
    with an existing page at `output` that this tool wrote (a PNG from an earlier run of ours)."""
    png = output.with_suffix(".png")
    if not png.exists():
        return ""
    if png.is_file() and output.is_file() and written_by_us(output):
        return ""
    return f"{png} exists and does not pair with a page this tool wrote; not overwriting it"


def export_png(fig: go.Figure, png: Path, width_px: int = 1600) -> str:
    """Static PNG through kaleido with the system Chromium; returns '' or why it was skipped
    (kaleido or Chromium missing, or any error they raise: the PNG is optional, the page is written)."""
    from analysis.html_check import find_chromium

    try:
        import kaleido  # noqa: F401
    except ImportError:
        return "kaleido is not installed (pip install kaleido)"
    chromium = find_chromium()
    if chromium is None:
        return "no system chromium (bash scripts/install_chromium.sh)"
    import os

    os.environ.setdefault("BROWSER_PATH", chromium)  # kaleido drives this Chromium, downloads none
    try:
        fig.write_image(str(png), width=width_px, height=int(fig.layout.height))
    except Exception as e:  # kaleido/Chromium failures come in many types; none is worth a traceback
        first = (str(e).strip().splitlines() or [""])[0]
        return f"{type(e).__name__}: {first}"
    return ""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m analysis.timeline",
        epilog="Exit codes: 0 written, 2 bad input (the message says which). Progress goes to stderr.",
        description="Write an interactive, self-contained HTML timeline of nsys SQLite exports: one panel "
                    "per trace, stacked on a shared time axis, with lanes per rank for CPU NVTX phases, "
                    "communication ranges and GPU streams, and shading where communication overlaps compute. "
                    "Prints one summary row per panel.",
    )
    ap.add_argument("traces", nargs="+", type=Path,
                    help="nsys SQLite exports, one panel each in this order; <impl>.rank<N>.sqlite files of "
                         "one folder (run_nsys.sh --per-rank) are merged into one panel")
    ap.add_argument("-o", "--output", type=Path,
                    help="HTML file to write (default: reports/timeline.html)")
    ap.add_argument("--step", type=int, help="draw only step N of every trace (default: all steps)")
    ap.add_argument("--rank", type=int, help="draw only rank R (default: all ranks)")
    ap.add_argument("--width", type=int, default=1600,
                    help="pixels across the full view; work narrower than one pixel is merged (default 1600)")
    ap.add_argument("--format", choices=FORMATS, default="table", help="summary output format (default table)")
    ap.add_argument("--png", action="store_true",
                    help="also write <output>.png, --width pixels wide (needs kaleido and a system Chromium; "
                         "skipped with a message when they are missing or fail, and when a PNG exists that "
                         "does not pair with a page this tool wrote)")
    args = ap.parse_args(argv)
    if not 100 <= args.width <= 20000:
        ap.error(f"--width {args.width}: expected 100..20000 pixels")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        selection = Selection(step=args.step, rank=args.rank)
        check_output(args.output or DEFAULT_OUTPUT, args.traces, explicit=args.output is not None)
        args.output = args.output or DEFAULT_OUTPUT
        from analysis.trace import load_trace

        panels, rows = [], []
        for inp in group_inputs(args.traces):
            t0 = time.perf_counter()
            trace = load_trace(list(inp.paths))
            panel, row = trace_panel(inp.label, selection, trace=trace, width_px=args.width)
            panels.append(panel)
            rows.append(row)
            progress(f"{inp.label}: {row.segments} segments in view ({time.perf_counter() - t0:.1f} s)")
        title = "Timeline: " + " vs ".join(r.implementation for r in rows)
        png_why = png_refusal(args.output) if args.png else ""  # before the page is (re)written
        out, fig = write_timeline(panels, args.output, title, selection, args.width)
        progress(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB, "
                 f"{count_drawn_segments(fig)} segments drawn after merging)")
        if args.png:
            why = png_why or export_png(fig, args.output.with_suffix(".png"), args.width)
            progress(f"png skipped: {why}" if why else f"wrote {args.output.with_suffix('.png')}")
    except TraceError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"error: {e.filename or ''}: {e.strerror or e}", file=sys.stderr)
        return 2
    print_rows(rows, args.format)
    return 0


if __name__ == "__main__":
    sys.exit(main())
