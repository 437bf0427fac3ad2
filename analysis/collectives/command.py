"""Collectives view: what every collective moved, how fast, how late, and how much was waiting.

    python -m analysis.collectives TRACE... [--format table|csv|json] [--rank R] [--step N] [--peak-busbw GBPS]

One row per collective call per rank (collective_calls.py finds them, call_groups.py pairs them across
ranks into wait and transfer, collective_stats.py adds bandwidths and summaries). Python API:
`open_runs(paths).collectives() -> CollectivesView` with `.calls`, `.by_size`, `.by_rank`,
`.stragglers` and `.traces` DataFrames (session.py); `collectives_of([trace])` does loaded traces.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from analysis import cli
from analysis.cache.answers import answered
from analysis.errors import TraceError
from analysis.options import add_options
from contract import COMM_FORM

if TYPE_CHECKING:  # the library loads after the answer cache is asked (cache/answers.py): start-up stays light
    import pandas as pd

    from analysis.collectives.collectives_view import CollectivesView

TABLE_ROWS = {
    "rank": "rank",
    "step": "step",
    "phase": "phase",
    "op": "op",
    "family": "family",
    "tag": "tag",
    "bytes": "bytes",
    "issue_ms": "issue ms",
    "start_ms": "start ms",
    "end_ms": "end ms",
    "duration_ms": "duration ms",
    "wait_ms": "wait ms",
    "transfer_ms": "transfer ms",
    "busbw_gbps": "busbw GB/s",
    "exposed_ms": "exposed ms",
    "waited_ms": "waited ms",
}
# The summaries' ms add up every call's own time: calls in flight together (async all-reduces of several
# buckets, waits of several ranks) each count, so a sum is not wall time and can exceed the steps' length.
SUMMED = "ms summed over the calls, each counted in full: not wall time"
STRAGGLER_HEADINGS = {
    "times_last": "times last",
    "wait_caused_ms": "wait caused ms (sum)",
    "wait_ms": "wait ms (sum)",
    "late_ms": "late ms",
    "cause_ms": "cause ms",
    "steps_held": "steps held",
    "recurrently_late": "recurrently late",
}
SUMMARY_TABLE = [
    "calls",
    "bytes",
    "duration_ms",
    "wait_ms",
    "transfer_ms",
    "median_busbw_gbps",
    "p90_busbw_gbps",
    "wait_share",
    "exposed_share",
]


def _fmt(frame: pd.DataFrame, names: dict | None = None) -> str:
    from analysis.render.table import format_table

    return format_table(frame, names)


def _with_bytes_text(frame: pd.DataFrame) -> pd.DataFrame:
    """bytes as whole numbers, '-' when unknown (a float column would print 4000000.000)."""
    import numpy as np

    b = frame["bytes"].to_numpy(dtype=float)
    return frame.assign(bytes=np.where(np.isnan(b), "-", np.nan_to_num(b).astype(np.int64).astype(str)))


def _several_groups(view: CollectivesView) -> bool:
    """Whether a run's calls name more than one process group (only then do the outputs show groups)."""
    from analysis.collectives.collective_stats import group_count

    return any(group_count(calls) > 1 for _, calls in view.calls.groupby("path", sort=False))


def _group_section(view: CollectivesView) -> list[tuple[str, pd.DataFrame, list[str]]]:
    """(title, rows, keys) of the per-group summary when a run has several process groups, and of the
    intra- / inter-host one when its ranks are on several hosts; else nothing."""
    out = []
    if _several_groups(view):
        out.append((f"by process group (dimension or name, member ranks; {SUMMED}):", view.by_group, ["group"]))
    if len(view.by_host_scope):
        title = f"within one host or across hosts (the calls' group members; {SUMMED}):"
        out.append((title, view.by_host_scope, ["host_scope"]))
    return out


def render_table(view: CollectivesView, summary_only: bool, units: int = 0, rank: int | None = None) -> str:
    from analysis.collectives.in_time_table import units_text
    from analysis.collectives.straggler_cause import CAUSE_TEXT
    from analysis.measure.collective_calls import OUTSIDE_STEPS
    from analysis.trace.frames import KERNELS

    out = []
    several = len(view.traces) > 1
    lead = ["implementation"] if several else []
    if view.traces["implementation"].duplicated().any():  # names collide: say which run
        lead = ["trace", "implementation"]
    trace = dict(zip(view.traces["path"], view.traces["path"].map(cli.short_trace), strict=True))
    if not summary_only:
        calls = _with_bytes_text(view.calls.assign(trace=view.calls["path"].map(trace))[lead + list(TABLE_ROWS)])
        out += ["calls (one row per collective call per rank):", _fmt(calls, TABLE_ROWS), ""]
    impl = dict(zip(view.traces["path"], view.traces["implementation"], strict=True))
    for title, frame, keys in (
        (f"by op and message size (all calls of all ranks; {SUMMED}):", view.by_size, ["op", "size_class"]),
        (f"by rank ({SUMMED}):", view.by_rank, ["rank"]),
        *_group_section(view),
    ):
        if frame.empty:  # no calls at all: the note below says why
            out += [title, "(none)", ""]
            continue
        extra = [c for c in ("median_busbw_pct_peak",) if c in frame]
        named = frame.assign(implementation=frame["path"].map(impl), trace=frame["path"].map(trace))
        shown = named[[*lead, *keys, *SUMMARY_TABLE, *extra]]
        out += [title, _fmt(_with_bytes_text(shown)), ""]
    strag = view.stragglers
    shown = "(none)"
    if not strag.empty:
        strag = strag.assign(implementation=strag["path"].map(impl), trace=strag["path"].map(trace))
        columns = [*lead, "step", "collectives", "straggler", "times_last", "wait_caused_ms", "wait_ms"]
        columns += ["cause", "late_ms", "cause_ms"]
        strag = strag.assign(cause=strag["cause"].map(CAUSE_TEXT).fillna("-"))
        shown = _fmt(strag[columns], {c: STRAGGLER_HEADINGS.get(c, c.replace("_", " ")) for c in columns})
    out += [
        "stragglers per step (the rank the others waited for; paired collectives only; waits summed over the "
        "step's calls and waiting ranks, so calls in flight together each count: not wall time, a sum can "
        "exceed the step; cause: where the straggler's lateness at the collective it held most came from, "
        "late ms: how much later than the others' median it arrived there, cause ms: the part of it in the "
        "cause):",
        shown,
        "",
        *_summary_lines(view, lead, trace, impl),
    ]
    for head in view.traces.itertuples():
        origin = "kernels" if head.source == KERNELS else f"{COMM_FORM} ranges (no communication kernels)"
        out.append(
            f"\n{head.implementation}: {head.calls} calls from {origin}, world size {head.world_size}, "
            f"{head.ranks} ranks in the trace" + (f"; note: {head.note}" if head.note else "")
        )
        out.append(f"  phases: {head.phases}")
        outside = getattr(head, "outside_steps_calls", 0)
        if outside:
            out.append(
                f"  {outside} calls outside the measured steps (e.g. the closing barrier): listed with phase "
                f"'{OUTSIDE_STEPS}', left out of the summaries and stragglers"
            )
        out += [f"  {sentence}" for sentence in getattr(head, "in_time", None) or []]
    out += units_text(view, units, rank)
    return "\n".join(out)


def _summary_lines(view: CollectivesView, lead: list[str], trace: dict, impl: dict) -> list[str]:
    """The straggler summary per rank that held a step, with the rule for `recurrently late`."""
    from analysis.collectives.straggler_cause import CAUSE_TEXT, RECURRENT_RULE

    summary = view.straggler_summary
    shown = "(none)"
    if not summary.empty:
        causes = summary["causes"].map(lambda c: ", ".join(f"{CAUSE_TEXT.get(k, k)} {n}" for k, n in c.items()))
        summary = summary.assign(
            implementation=summary["path"].map(impl),
            trace=summary["path"].map(trace),
            causes=causes,
            recurrently_late=summary["recurrently_late"].map({True: "yes", False: "no"}),
        )
        columns = [*lead, "rank", "steps_held", "steps", "wait_caused_ms", "causes", "recurrently_late"]
        shown = _fmt(summary[columns], {c: STRAGGLER_HEADINGS.get(c, c.replace("_", " ")) for c in columns})
    return [
        f"straggler summary per rank (steps it held of those with a straggler, the wait it caused; {RECURRENT_RULE}):",
        shown,
    ]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m analysis.collectives",
        description="Every collective call of every rank in Nsight Systems SQLite exports or torch.profiler "
        "JSON traces: op, tag (parameter or "
        "bucket), bytes, issue time, kernel start/end, and, paired across ranks (the k-th call of an "
        "op in a step on each rank is one collective), the wait for the last rank to arrive, the "
        "transfer after it, bus bandwidth (nccl-tests factors) and the part with no compute under it. "
        "Summaries per op and message size, per rank, and the straggler rank of each step. Times are "
        "ms on the trace's clock. Traces without communication kernels (CPU, gloo) use the "
        f"{COMM_FORM} ranges: arrival = issue, end = completion as seen by the rank.",
        epilog=cli.EXIT_STATUS,
    )
    cli.add_input_options(p, "their calls")
    format_help = (
        "table: calls then summaries; csv: the per-call rows, every column; json: calls, summaries "
        "and stragglers per trace"
    )
    add_options(p, ["format"], helps={"format": format_help})
    p.add_argument(
        "--peak-busbw",
        type=float,
        metavar="GBPS",
        help="the interconnect's peak bus bandwidth in GB/s: adds busbw as %% of it",
    )
    p.add_argument("--summary", action="store_true", help="table: summaries only, no per-call rows")
    p.add_argument(
        "--units",
        type=int,
        default=10,
        metavar="N",
        help="table: the N worst sharded units' all-gathers per trace (per phase and unit: held ms per step, "
        "late gathers, their main cause; -1: all, 0: none; default 10); json has every gather row",
    )
    p.add_argument(
        "--prefetch-chart",
        type=Path,
        metavar="HTML",
        help="also write the prefetch chart: per sharded unit in forward order, the time its all-gathers held "
        "its compute (GPU) or the rank waited (CPU) per step, by cause, forward and backward; with up to 40 "
        "units also one step's forward all-gathers (issue to end, the held part, when its forward began) "
        "for --step/--rank, else rank 0's median step; one per trace (plotly.js written beside the page; an "
        "existing file is replaced only if this tool wrote it)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return answered("collectives", args, lambda: cli.run(lambda: _run(args)), writes=("prefetch_chart",))


def _check_chart_path(path: Path) -> None:
    """Refuse to replace a file this tool did not write (before any trace is read)."""
    from analysis.render.html_page import written_by_us

    if path.exists() and (not path.is_file() or not written_by_us(path)):
        raise TraceError(f"--prefetch-chart {path}: exists and was not written by this tool; refusing to overwrite it")


def _run(args: argparse.Namespace) -> int:

    if args.prefetch_chart:
        _check_chart_path(args.prefetch_chart)
    if args.peak_busbw is not None and not args.peak_busbw > 0:
        raise TraceError(f"--peak-busbw {args.peak_busbw}: must be a positive number of GB/s")
    runs = cli.open_from_args(args, "[collectives]", keep_traces=False, needs_events=True)
    bad = cli.report_failures(runs.results())
    if not runs.good():
        return 2
    runs.check_selection(args.step, args.rank)
    view = runs.collectives(rank=args.rank, step=args.step, peak_busbw=args.peak_busbw)
    if args.prefetch_chart:
        _write_prefetch_chart(args.prefetch_chart, view, args.rank)
    cli.emit(lambda: _print(args, view))
    return 2 if bad else 0


def _write_prefetch_chart(path: Path, view: CollectivesView, rank: int | None) -> None:
    from analysis.fsdp_units.charts import STEP_CHART_UNITS, measured, pick_step, prefetch_figure, units_figure
    from analysis.render.html_page import write_page

    figures: list = []
    for head in view.traces.itertuples():  # per trace: the per-unit chart, and one step's when it stays readable
        gathers = view.gathers[view.gathers["path"] == head.path]
        gathers = gathers if rank is None else gathers[gathers["rank"] == rank]
        rows = view.prefetch[view.prefetch["path"] == head.path]
        rows = rows if rank is None else rows[rows["rank"] == rank]
        chosen = pick_step(rows)
        if chosen is None:
            raise TraceError(f"{head.path}: no forward all-gather to chart (--prefetch-chart needs sharded modules)")
        if measured(gathers):
            figures.append(units_figure(gathers, head.implementation))
        if rows["tag"].nunique() <= STEP_CHART_UNITS:
            gpu = "GPU" in str(gathers["definition"].iloc[0])
            held = "compute stream held for it (GPU)" if gpu else "compute waited for it (CPU)"
            figures.append(prefetch_figure(rows, *chosen, head.implementation, held))
    intro = " ".join(  # one sentence per trace, named: several traces' answers must not run together
        f"{head.implementation} ({Path(head.path).name}): {'; '.join(head.in_time)}."
        for head in view.traces.itertuples()
        if head.in_time
    )
    write_page(path, "Prefetch: did the all-gathers arrive in time?", figures, intro)
    print(f"wrote {path}", file=sys.stderr)


def _print(args: argparse.Namespace, view: CollectivesView) -> None:
    if args.format == "json":
        print(json.dumps(view.to_json()))
    elif args.format == "csv":
        from analysis.measure.call_groups import FOLDED, GROUP_COLUMNS

        several = _several_groups(view)
        calls = view.calls if several else view.calls.drop(columns=[*GROUP_COLUMNS, FOLDED])
        if several and not calls[FOLDED].astype(bool).any():  # no inferred call folded into a named group
            calls = calls.drop(columns=FOLDED)
        if not (calls["host_scope"] != "").any():  # one host (or hosts unknown): the column says nothing
            calls = calls.drop(columns="host_scope")
        print(calls.to_csv(index=False), end="")
        for head in view.traces.itertuples():  # stdout stays one CSV table: notes go to stderr
            print(f"phases: {head.path}: {head.phases}", file=sys.stderr)
            if head.note:
                print(f"note: {head.path}: {head.note}", file=sys.stderr)
    else:
        print(render_table(view, args.summary, args.units, args.rank))


if __name__ == "__main__":
    sys.exit(main())
