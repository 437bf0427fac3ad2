"""How much gradient communication overlapped compute and the backward pass, per rank and step.

    python -m analysis.overlap TRACE... [--merge] [--format table|csv|json] [--jobs N] [--step N] [--rank R]

Python API (notebooks): `open_runs(paths).overlap() -> Analysis` with `.steps`, `.totals`,
`.summary` DataFrames and `.to_json()` (the CLI's JSON), in api.py. See
overlap/metrics.py for what each metric means.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from analysis import cli
from analysis.cache.answers import answered
from analysis.options import add_options

if TYPE_CHECKING:  # the library loads after the answer cache is asked (cache/answers.py): start-up stays light
    import pandas as pd

    from analysis.overlap.analyze import Analysis

TABLE_COLUMNS = {
    "implementation": "implementation",
    "rank": "rank",
    "steps": "steps",
    "step_ms": "step ms",
    "comm_ms": "comm ms",
    "overlap_pct": "overlap %",
    "exposed_comm_ms": "exposed comm ms",
    "backward_overlap_ms": "backward overlap ms",
}


def _fmt(frame: pd.DataFrame) -> str:
    from analysis.render.table import format_table

    return format_table(frame, TABLE_COLUMNS)


def _lead(result: Analysis) -> list[str]:
    """['trace', 'implementation'] when two runs share an implementation name, else ['implementation']."""
    return ["trace", "implementation"] if result.summary["implementation"].duplicated().any() else ["implementation"]


def _with_trace(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.assign(trace=frame["path"].map(cli.short_trace))


def render_table(result: Analysis, per_step: bool) -> str:
    from analysis.overlap.analyze import per_rank_table

    out = []
    lead = _lead(result)
    table = _with_trace(per_rank_table(result))
    out.append(
        _fmt(
            table[
                [
                    *lead,
                    "rank",
                    "steps",
                    "step_ms",
                    "comm_ms",
                    "overlap_pct",
                    "exposed_comm_ms",
                    "idle_ms",
                    "comm_source",
                ]
            ]
        )
    )
    if per_step:
        cols = [
            *lead,
            "rank",
            "step",
            "step_ms",
            "backward_ms",
            "compute_ms",
            "comm_ms",
            "overlap_ms",
            "backward_overlap_ms",
            "exposed_comm_ms",
            "overlap_pct",
        ]
        steps = _with_trace(result.steps)[cols].astype({"step": object})
        steps["step"] = steps["step"].where(result.steps["step"].notna(), "all")  # no step ranges: whole capture
        out += ["", "per step:", _fmt(steps)]
    out += op_phase_lines(result)
    out += group_lines(result)
    out += ["", "summary (mean per step over ranks):"]
    summary = _with_trace(result.summary).assign(rank="all")
    out.append(
        _fmt(
            summary[
                [
                    *lead,
                    "source",
                    "rank",
                    "steps",
                    "step_ms",
                    "comm_ms",
                    "overlap_pct",
                    "exposed_comm_ms",
                    "backward_overlap_ms",
                ]
            ]
        )
    )
    out += ["", *notes(result)]
    return "\n".join(out).rstrip()


def op_phase_lines(result: Analysis) -> list[str]:
    """One line per rank with communication: comm ms per step of each phase and op, the exposed part in
    brackets (means over the rank's kept steps; the whole capture where it has no steps)."""
    rows = result.by_op_phase
    if len(rows) == 0:
        return []
    lines = ["", "communication by phase and op (ms per step; exposed in brackets):"]
    for (_, rank), mine in rows.groupby(["path", "rank"], sort=False):  # one pass per rank
        stepped = mine[mine["step"].notna()]
        n = int(stepped["step"].nunique()) if len(stepped) else 1
        use = stepped if len(stepped) else mine
        sums = use.groupby(["phase", "op"], sort=False)[["calls", "comm_ms", "exposed_ms"]].sum()
        parts = [
            f"{phase} {op} x{r.calls / n:g} {r.comm_ms / n:.3f} ({r.exposed_ms / n:.3f})"
            for (phase, op), r in zip(sums.index, sums.itertuples(), strict=True)
        ]
        impl = mine["implementation"].iloc[0]
        lines.append(f"  rank {rank} ({impl}): " + "; ".join(parts))
        lines += overlap_note(use, n)
    return lines


def group_lines(result: Analysis) -> list[str]:
    """Per rank of a run with several process groups: each group's communication over the capture, the part
    hidden under compute and the exposed rest (measure/comm_breakdown.py); nothing for one-group runs."""
    rows = result.by_group
    if len(rows) == 0:
        return []
    several = rows.groupby("path")["label"].nunique() > 1
    if not several.any():
        return []
    shown = rows[rows["path"].isin(several[several].index)]
    lines = ["", "communication by process group (whole capture, ms; exposed in brackets, overlap %):"]
    for (_, rank), mine in shown.groupby(["path", "rank"], sort=False):  # one pass per rank
        parts = [
            f"{r.label} x{r.calls} {r.comm_ms:.3f} ({r.exposed_comm_ms:.3f}, {r.overlap_pct:.1f}%)"
            for r in mine.itertuples()
        ]
        lines.append(f"  rank {rank}: " + "; ".join(parts))
    return lines


def overlap_note(rows: pd.DataFrame, n: int) -> list[str]:
    """A note under a rank's rows when they overlap in time (not a partition: comm_breakdown.py): what they add up
    to beside the rank's communication counted once (all_comm_ms), per step."""
    once = rows.drop_duplicates("step")[["all_comm_ms", "all_exposed_ms"]].sum() / n
    summed = rows[["comm_ms", "exposed_ms"]].sum() / n
    if summed["comm_ms"] <= once["all_comm_ms"] + 5e-4:  # they partition it: nothing to say
        return []
    return [
        f"    note: these rows overlap in time (calls of different phases or ops in flight together count in "
        f"each): they add up to {summed['comm_ms']:.3f} ({summed['exposed_ms']:.3f}) ms per step, the rank's "
        f"calls counted once to {once['all_comm_ms']:.3f} ({once['all_exposed_ms']:.3f})"
    ]


def memory_line(row: dict) -> str:
    """'memory per rank (MiB, largest rank): peak 114.8 = parameters 11.8 + ...' from a summary row ('' without);
    a part that could not be counted (torch_fsdp's gathered on some torch) and so the peak read n/a."""
    from analysis.trace.run_info import MEMORY_COLUMNS

    known = lambda v: v is not None and v == v  # None or NaN: not recorded
    if not known(row.get("mem_parameters_mib")):
        return ""
    mib = lambda v: f"{v:g}" if known(v) else "n/a"
    parts = " + ".join(
        f"{name.removeprefix('mem_').removesuffix('_mib')} {mib(row.get(name))}" for name in MEMORY_COLUMNS[:-2]
    )
    cuda = row.get("cuda_max_allocated_mib")
    on_cuda = f"{cuda:g}" if known(cuda) else "n/a (not CUDA)"
    peak = mib(row.get("mem_peak_mib"))
    return f"memory per rank (MiB, largest rank): peak {peak} = {parts}; CUDA max allocated {on_cuda}"


def notes(result: Analysis) -> list[str]:
    """Per run: its metadata, its design notes (trace/run_info.py: figures the strategy, backend or shared
    GPUs decide) and a note when ranks are missing."""
    from analysis.overlap.analyze import METADATA
    from analysis.trace.run_info import MEMORY_COLUMNS, design_notes, nccl_label

    lines = []
    for row in result.summary.to_dict("records"):  # one per trace
        about = {k: row.get(k) for k in METADATA if k not in ("shared_gpus", "nccl_build", *MEMORY_COLUMNS)}
        about["nccl"] = nccl_label(row.get("nccl"), row.get("nccl_build"))  # loaded, torch's build beside
        known = ", ".join(f"{k} {v}" for k, v in about.items() if v is not None and v == v)
        names = ", ".join(Path(p).name for p in str(row["path"]).split(", "))  # merged files: every name
        lines.append(f"{names}: {known or 'no run metadata'}; profiler {row['profiler']}")
        memory = memory_line(row)
        if memory:
            lines.append(f"  {memory}")
        if isinstance(row.get("phases"), str) and row["phases"]:
            lines.append(f"  phases: {row['phases']}")
        for note in ("comm_note", "clock_note"):
            if isinstance(row.get(note), str) and row[note]:
                lines.append(f"  note: {row[note]}")
        for note in design_notes(row.get("implementation"), row.get("backend"), row.get("shared_gpus")):
            lines.append(f"  note: {note}")
        if row.get("ranks_note"):
            lines.append(f"  note: {row['ranks_note']}")
    return lines


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m analysis.overlap",
        description="Measure, per rank and per step, how much gradient communication overlapped compute and "
        "the backward pass in Nsight Systems SQLite exports (nsys 2022.4 to today) or torch.profiler "
        "JSON traces. Without GPU activity (CPU runs) the metrics come from the CPU ranges alone "
        "(source: ranges).",
        epilog=cli.EXIT_STATUS,
    )
    cli.add_input_options(p, "one summary row each")
    format_help = (
        "table: per-rank rows + per-run summary; csv: the table's per-rank rows with every metric "
        "(or per-step rows); json: everything, with each rank's whole-capture total"
    )
    add_options(p, ["format"], helps={"format": format_help})
    p.add_argument("--per-step", action="store_true", help="also list every step (table), or one csv row per step")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return answered("overlap", args, lambda: cli.run(lambda: _run(args)))


def _run(args: argparse.Namespace) -> int:

    runs = cli.open_from_args(args, "[overlap]", keep_traces=False)
    bad = cli.report_failures(runs.results())
    good = runs.good()
    if not good:
        return 2
    result = runs.overlap(args.step, args.rank)
    spread = [_across_selected(r.across_ranks, args.step) for r in good if len(r.run.paths) > 1]
    cli.emit(lambda: _print(args, result, spread))
    return 2 if bad else 0


def _across_selected(across_ranks: pd.DataFrame, step: int | None) -> pd.DataFrame:
    return across_ranks if step is None or across_ranks.empty else across_ranks[across_ranks["step"] == step]


def _print(args: argparse.Namespace, result: Analysis, spread: list[pd.DataFrame]) -> None:
    import pandas as pd

    from analysis.overlap.analyze import per_rank_table
    from analysis.render.table import plain_records
    from analysis.trace.run_info import design_notes

    if args.format == "json":
        doc = result.to_json()
        by_path = {str(f["path"].iloc[0]): f for f in spread if len(f)}
        for trace in doc["traces"]:  # a run of several files: the per-step view across its ranks
            about = trace["metadata"]
            trace["notes"] = design_notes(trace["implementation"], about.get("backend"), about.get("shared_gpus"))
            if trace["path"] in by_path:
                trace["steps_across_ranks"] = plain_records(by_path[trace["path"]].drop(columns="path"))
        print(json.dumps(doc))  # compact: the C encoder (indent= falls back to pure Python)
    elif args.format == "csv":
        frame = result.steps if args.per_step else per_rank_table(result)  # the table's rows
        if args.per_step:  # the per-rank rows carry the notes already (per_rank_table)
            notes = result.summary.set_index("path")["ranks_note"]
            frame = frame.assign(ranks_note=frame["path"].map(notes))
        print(frame.to_csv(index=False), end="")
    else:
        print(render_table(result, args.per_step))
        shown = [f for f in spread if len(f)]
        if args.per_step and shown:
            print(
                "\nper step across ranks (a step is as slow as its slowest rank; skew: last minus first "
                "rank to start/end it, clocks aligned):"
            )
            print(_fmt(pd.concat(shown, ignore_index=True).drop(columns="path")))


if __name__ == "__main__":
    sys.exit(main())
