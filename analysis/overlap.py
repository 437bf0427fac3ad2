"""How much gradient communication overlapped compute and the backward pass, per rank and step.

    python -m analysis.overlap traces/overlap.sqlite [more.sqlite ...] [--format table|csv|json] [--jobs N]

Python API (notebooks): `analyze(paths) -> Analysis` with `.steps`, `.totals`, `.summary`
DataFrames and `.to_json()` (the CLI's JSON), in engine/analyze.py. See measures/metrics.py for
what each metric means.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

from analysis import cli
from analysis.engine.analyze import METADATA, Analysis, input_groups, per_rank_table
from analysis.errors import TraceError
from analysis.frames.run_info import MEMORY_COLUMNS
from analysis.views.table import format_table, plain_records

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
    return format_table(frame, TABLE_COLUMNS)


def render_table(result: Analysis, per_step: bool) -> str:
    out = []
    table = per_rank_table(result)
    out.append(
        _fmt(
            table[
                [
                    "implementation",
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
            "implementation",
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
        steps = result.steps[cols].astype({"step": object})
        steps["step"] = steps["step"].where(result.steps["step"].notna(), "all")  # no step ranges: whole capture
        out += ["", "per step:", _fmt(steps)]
    out += op_phase_lines(result)
    out += ["", "summary (mean per step over ranks):"]
    summary = result.summary.assign(rank="all")
    out.append(
        _fmt(
            summary[
                [
                    "implementation",
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
    return lines


def memory_line(row: dict) -> str:
    """'memory per rank (MiB, largest rank): peak 114.8 = parameters 11.8 + ...' from a summary row ('' without)."""
    peak = row.get("mem_peak_mib")
    if peak is None or peak != peak:
        return ""
    parts = " + ".join(
        f"{name.removeprefix('mem_').removesuffix('_mib')} {row[name]:g}" for name in MEMORY_COLUMNS[:-2]
    )
    cuda = row.get("cuda_max_allocated_mib")
    on_cuda = "n/a (not CUDA)" if cuda is None or cuda != cuda else f"{cuda:g}"
    return f"memory per rank (MiB, largest rank): peak {peak:g} = {parts}; CUDA max allocated {on_cuda}"


def notes(result: Analysis) -> list[str]:
    """Per trace: the run's metadata, and a warning where ranks share a GPU."""
    lines = []
    for row in result.summary.to_dict("records"):  # one per trace
        about = {k: row.get(k) for k in METADATA if k != "shared_gpus" and k not in MEMORY_COLUMNS}
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
        if isinstance(row.get("shared_gpus"), str):
            lines.append(
                f"  note: ranks {row['shared_gpus']} share one GPU: their compute and idle are not "
                "exclusive GPU time, and one rank's kernels slow the other's"
            )
    return lines


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m analysis.overlap",
        description="Measure, per rank and per step, how much gradient communication overlapped compute and "
        "the backward pass in Nsight Systems SQLite exports (nsys 2022.4 to today). Without CUPTI "
        "tables (CPU runs) the metrics come from NVTX ranges alone (source: ranges).",
        epilog="Exit status: 0 ok, 2 bad input (message on stderr).",
    )
    p.add_argument(
        "paths",
        nargs="+",
        metavar="PATH",
        help="nsys SQLite export(s) (`nsys export --type sqlite`) or torch.profiler JSON trace(s) "
        "(.json/.json.gz, one per rank: give one job's ranks with --merge)",
    )
    p.add_argument(
        "--format",
        choices=["table", "csv", "json"],
        default="table",
        help="table: per-rank rows + per-trace summary; csv: the table's per-rank rows with every metric "
        "(or per-step rows); json: everything, with each rank's whole-capture total",
    )
    p.add_argument("--per-step", action="store_true", help="also list every step (table), or one csv row per step")
    p.add_argument(
        "--skip-steps", type=int, default=0, metavar="N", help="leave each rank's first N steps out (warm-up)"
    )
    cli.add_pattern_options(p)
    p.add_argument(
        "--merge", action="store_true", help="treat all PATHs as one run (one rank per file, clocks aligned)"
    )
    p.add_argument(
        "--export", action="store_true", help="given a .nsys-rep, run `nsys export` first when nsys is found"
    )
    p.add_argument(
        "--jobs",
        type=int,
        default=None,
        metavar="N",
        help="analyse files in N processes (default: the usable cores, at most one per file, fewer "
        "when memory cannot hold that many files at once; 1 for inputs under 64 MB in all)",
    )
    p.add_argument(
        "--dask",
        metavar="ADDRESS",
        help="run the per-file tasks on the Dask cluster at ADDRESS (tcp://host:8786; 'local': a "
        "LocalCluster of --jobs workers); paths must be visible to the workers. Needs "
        "dask[distributed]",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return cli.run(lambda: _run(args))


def _run(args: argparse.Namespace) -> int:
    from analysis.engine.groups import analyze_groups, concat_analyses, report_failures
    from analysis.engine.parallel import Progress, check_jobs, default_jobs

    patterns = cli.patterns_from(args)
    check_jobs(args.jobs)
    if args.skip_steps < 0:
        raise TraceError(f"skip_steps={args.skip_steps}: must be >= 0")
    groups = input_groups(args.paths, args.merge, args.export)
    files = [p for g in groups for p in g]
    big = sum(p.stat().st_size for p in files if p.is_file()) > 200 * 2**20
    progress = Progress(len(files), "[overlap]", after_s=0 if big else None)
    done = analyze_groups(groups, patterns, args.skip_steps, args.jobs or default_jobs(files), args.dask, progress)
    bad = report_failures(done)
    good = [g.merged for g in done if g.merged is not None]
    if not good:
        return 2
    result = concat_analyses([m.analysis for m in good])
    cli.emit(lambda: _print(args, result, good[0].across_ranks))
    return 2 if bad else 0


def _print(args: argparse.Namespace, result: Analysis, across_ranks: pd.DataFrame) -> None:
    if args.format == "json":
        doc = result.to_json()
        if args.merge:  # the per-step view across the run's ranks
            doc["traces"][0]["steps_across_ranks"] = plain_records(across_ranks)
        print(json.dumps(doc))  # compact: the C encoder (indent= falls back to pure Python)
    elif args.format == "csv":
        frame = result.steps if args.per_step else per_rank_table(result)  # the table's rows
        print(frame.to_csv(index=False), end="")
    else:
        print(render_table(result, args.per_step))
        if args.merge and args.per_step and len(across_ranks):
            print(
                "\nper step across ranks (a step is as slow as its slowest rank; skew: last minus first "
                "rank to start/end it, clocks aligned):"
            )
            print(_fmt(across_ranks.drop(columns="path")))


if __name__ == "__main__":
    sys.exit(main())
