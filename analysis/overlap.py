"""How much gradient communication overlapped compute and the backward pass, per rank and step.

    python -m analysis.overlap traces/overlap.sqlite [more.sqlite ...] [--format table|csv|json] [--jobs N]

Python API (notebooks): `analyze(paths) -> Analysis` with `.steps`, `.totals`, `.summary`
DataFrames and `.to_json()` (the CLI's JSON). See metrics.py for what each metric means.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from analysis.collective_calls import Calls
from analysis.collective_rows import call_rows, with_comm_split
from analysis.errors import TraceError
from analysis.metrics import METRICS, SOURCES, measure_trace, summarise
from analysis.nsys_export import export_report, is_report, report_error
from analysis.patterns import Patterns
from analysis.run_info import trace_metadata
from analysis.trace import Trace

TRACE_KEYS = ["path", "implementation", "source", "nsys_version"]
RANK_KEYS = ["rank", "pid", "device"]
METADATA = ["gpus", "driver", "cuda_driver", "cuda", "nccl", "torch", "backend", "world_size", "model",
            "profiler", "shared_gpus"]  # summary columns from run_info.trace_metadata
TABLE_COLUMNS = {"implementation": "implementation", "rank": "rank", "steps": "steps", "step_ms": "step ms",
                 "comm_ms": "comm ms", "overlap_pct": "overlap %", "exposed_comm_ms": "exposed comm ms",
                 "backward_overlap_ms": "backward overlap ms"}


@dataclass(frozen=True)
class Analysis:
    """Results for one or more traces. `steps`: one row per trace, rank and step (after skipping);
    `totals`: one row per trace and rank over the whole capture; `summary`: one row per trace,
    metrics averaged over its steps and ranks, plus the run's metadata (METADATA columns). Each frame
    carries the trace keys (path, implementation, source, nsys_version); steps and totals carry each
    rank's comm_source, compute_source and shared_gpu."""

    steps: pd.DataFrame
    totals: pd.DataFrame
    summary: pd.DataFrame

    def to_json(self) -> dict:
        """The CLI's JSON document: {"traces": [{path, implementation, source, nsys_version, metadata,
        ranks: [{rank, pid, device, comm_source, compute_source, shared_gpu, steps, total}], summary}]}."""
        steps: dict[tuple, list] = {}
        for row in plain_records(self.steps, ["path", "rank", "step", *METRICS]):
            steps.setdefault((row.pop("path"), row.pop("rank")), []).append(row)
        ranks: dict[str, list] = {}
        sources = [c for c in SOURCES if c in self.totals]
        for row in plain_records(self.totals, ["path", *RANK_KEYS, *sources, *METRICS]):
            path = row.pop("path")
            ident = {k: row.pop(k) for k in [*RANK_KEYS, *sources]}
            ranks.setdefault(path, []).append({**ident, "steps": steps.get((path, ident["rank"]), []), "total": row})
        traces = []
        metadata = [c for c in METADATA if c in self.summary]
        for head in plain_records(self.summary, [*TRACE_KEYS, *metadata, "ranks", "steps", *METRICS]):
            trace = {k: head.pop(k) for k in TRACE_KEYS}
            about = {k: head.pop(k) for k in metadata}
            traces.append({**trace, "metadata": about, "ranks": ranks.get(trace["path"], []), "summary": head})
        return {"traces": traces}


def plain_records(frame: pd.DataFrame, columns: list[str] | None = None) -> list[dict]:
    """Result rows as dicts of plain Python values (JSON- and sqlite3-safe: numpy scalars -> Python,
    NaN/NA -> None), for `columns` (default all) in that order; one pass over the (few) result rows."""
    columns = list(frame.columns) if columns is None else columns
    return [{c: _plain(v) for c, v in zip(columns, row, strict=True)}
            for row in frame[columns].itertuples(index=False, name=None)]


def _plain(value):
    """JSON-safe scalar: numpy -> Python, NaN/NA -> None."""
    if value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value)):
        return None
    return value.item() if hasattr(value, "item") else value


def _skip_first_steps(per_step: pd.DataFrame, n: int) -> pd.DataFrame:
    if n <= 0:
        return per_step
    order = per_step.groupby("rank").cumcount()
    return per_step[(order >= n) | per_step["step"].isna()].reset_index(drop=True)


def analyze_trace(trace: Trace, patterns: Patterns | None = None, skip_steps: int = 0,
                  calls: Calls | None = None) -> Analysis:
    """Metrics of one loaded trace (`calls`: its collective_calls.find_calls, when already found)."""
    per_step, totals = measure_trace(trace, patterns)
    per_step, totals = with_comm_split(per_step, totals, call_rows(trace, patterns, calls)[0])  # collectives view
    per_step = _skip_first_steps(per_step, skip_steps)
    summary = trace_summary(trace, per_step)
    for frame in (per_step, totals):
        for i, (k, v) in enumerate(trace_keys(trace).items()):
            frame.insert(i, k, v)
    return Analysis(per_step, totals, summary)


def trace_keys(trace: Trace) -> dict:
    return {"path": trace.path, "implementation": trace.implementation, "source": trace.source,
            "nsys_version": trace.nsys_version}


def trace_summary(trace: Trace, per_step: pd.DataFrame) -> pd.DataFrame:
    """One row: the trace keys, the run's metadata (METADATA) and the metrics averaged over per_step.
    Needs only the trace's ranks, meta and info (rank_merge calls it on a merged run's)."""
    about = trace_metadata(trace)
    about["shared_gpus"] = "; ".join(",".join(map(str, g)) for g in about["shared_gpus"] or []) or None
    return pd.DataFrame([{**trace_keys(trace), **{k: about[k] for k in METADATA}, **summarise(per_step)}])


def _resolve(path: Path, export: bool) -> Path:
    if is_report(path) and path.exists():
        if not export:
            raise report_error(path)
        return export_report(path)
    return path


def analyze(paths: str | Path | Iterable[str | Path], patterns: Patterns | None = None, skip_steps: int = 0,
            merge: bool = False, export: bool = False, progress: Callable[[str], object] | None = None,
            jobs: int = 1, dask: str | None = None) -> Analysis:
    """Analyse each path as its own trace, or (merge=True) all paths as one-rank files of one run;
    files run in `jobs` processes or on the Dask cluster at `dask` (see parallel.py, rank_merge.py).
    Raises TraceError naming every file that failed."""
    from analysis.parallel import Progress
    from analysis.rank_merge import analyse_groups, concat_analyses

    if skip_steps < 0:
        raise TraceError(f"skip_steps={skip_steps}: must be >= 0")
    groups = _groups(paths, merge, export)
    shown = Progress(sum(map(len, groups)), "", after_s=0, write=progress) if progress else None
    done = analyse_groups(groups, patterns, skip_steps, jobs, dask, shown)
    errors = [e for g in done for e in g.errors]
    if errors:
        raise TraceError(errors[0] if len(errors) == 1 else f"{len(errors)} files failed: {'; '.join(errors)}")
    return concat_analyses([g.merged.analysis for g in done if g.merged is not None])


def _groups(paths: str | Path | Iterable[str | Path], merge: bool, export: bool) -> list[list[Path]]:
    given = [Path(paths)] if isinstance(paths, (str, Path)) else [Path(p) for p in paths]
    if not given:
        raise TraceError("no trace path given")
    resolved = [_resolve(p, export) for p in given]
    return [resolved] if merge else [[p] for p in resolved]


PER_RANK_KEYS = [*TRACE_KEYS, *RANK_KEYS]


def per_rank_table(result: Analysis) -> pd.DataFrame:
    """One row per trace and rank over the kept steps (after --skip-steps): the trace and rank keys,
    `steps` (that rank's step count), every metric as a mean per step (overlap_pct from the means),
    then where the figures come from (comm_source, compute_source) and shared_gpu."""
    keys = [*PER_RANK_KEYS, *[c for c in SOURCES if c in result.steps]]
    rows = []
    for _, steps in result.steps.groupby(["path", "rank"], sort=False):  # one pass per rank
        s = summarise(steps)
        first = steps[keys].iloc[0].to_dict()
        rows.append({**first, "steps": s["steps"], **{m: s[m] for m in METRICS}})
    return pd.DataFrame(rows, columns=[*PER_RANK_KEYS, "steps", *METRICS, *keys[len(PER_RANK_KEYS):]])


def _fmt(frame: pd.DataFrame) -> str:
    shown = frame.rename(columns={c: TABLE_COLUMNS.get(c, c.replace("_ms", " ms").replace("_", " ")) for c in frame})
    return shown.to_string(index=False, float_format=lambda v: f"{v:.3f}", na_rep="-")


def render_table(result: Analysis, per_step: bool) -> str:
    out = []
    table = per_rank_table(result)
    out.append(_fmt(table[["implementation", "rank", "steps", "step_ms", "comm_ms", "overlap_pct", "exposed_comm_ms",
                           "idle_ms", "comm_source"]]))
    if per_step:
        cols = ["implementation", "rank", "step", "step_ms", "backward_ms", "compute_ms", "comm_ms",
                "overlap_ms", "backward_overlap_ms", "exposed_comm_ms", "overlap_pct"]
        steps = result.steps[cols].astype({"step": object})
        steps["step"] = steps["step"].where(result.steps["step"].notna(), "all")  # no step ranges: whole capture
        out += ["", "per step:", _fmt(steps)]
    out += ["", "summary (mean per step over ranks):"]
    summary = result.summary.assign(rank="all")
    out.append(_fmt(summary[["implementation", "source", "rank", "steps", "step_ms", "comm_ms", "overlap_pct",
                             "exposed_comm_ms", "backward_overlap_ms"]]))
    out += ["", *notes(result)]
    return "\n".join(out).rstrip()


def notes(result: Analysis) -> list[str]:
    """Per trace: the run's metadata, and a warning where ranks share a GPU."""
    lines = []
    for row in result.summary.to_dict("records"):  # one per trace
        about = {k: row.get(k) for k in METADATA if k != "shared_gpus"}
        known = ", ".join(f"{k} {v}" for k, v in about.items() if v is not None and v == v)
        names = ", ".join(Path(p).name for p in str(row["path"]).split(", "))  # merged files: every name
        lines.append(f"{names}: {known or 'no run metadata'}; exported by nsys {row['nsys_version']}")
        if isinstance(row.get("shared_gpus"), str):
            lines.append(f"  note: ranks {row['shared_gpus']} share one GPU: their compute and idle are not "
                         "exclusive GPU time, and one rank's kernels slow the other's")
    return lines


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m analysis.overlap",
        description="Measure, per rank and per step, how much gradient communication overlapped compute and "
                    "the backward pass in Nsight Systems SQLite exports (nsys 2022.4 to today). Without CUPTI "
                    "tables (CPU runs) the metrics come from NVTX ranges alone (source: nvtx).",
        epilog="Exit status: 0 ok, 2 bad input (message on stderr).")
    p.add_argument("paths", nargs="+", metavar="PATH",
                   help="nsys SQLite export(s) (`nsys export --type sqlite`) or torch.profiler JSON trace(s) "
                        "(.json/.json.gz, one per rank: give one job's ranks with --merge)")
    p.add_argument("--format", choices=["table", "csv", "json"], default="table",
                   help="table: per-rank rows + per-trace summary; csv: the table's per-rank rows with every metric "
                        "(or per-step rows); json: everything, with each rank's whole-capture total")
    p.add_argument("--per-step", action="store_true", help="also list every step (table), or one csv row per step")
    p.add_argument("--skip-steps", type=int, default=0, metavar="N",
                   help="leave each rank's first N steps out (warm-up)")
    p.add_argument("--comm-pattern", default=Patterns.comm_kernel, metavar="RE",
                   help="regex for communication kernel names (default: NCCL/RCCL kernels of every era)")
    p.add_argument("--comm-range-pattern", default=Patterns.comm_range, metavar="RE",
                   help="regex for NVTX communication ranges (work launched inside counts as communication)")
    p.add_argument("--backward-pattern", default=Patterns.backward, metavar="RE", help="regex for backward NVTX ranges")
    p.add_argument("--step-pattern", default=Patterns.step, metavar="RE",
                   help="regex for step NVTX ranges; group 1, if any, is the step number")
    p.add_argument("--merge", action="store_true",
                   help="treat all PATHs as one run (one rank per file, clocks aligned)")
    p.add_argument("--export", action="store_true",
                   help="given a .nsys-rep, run `nsys export` first when nsys is found")
    p.add_argument("--jobs", type=int, default=None, metavar="N",
                   help="analyse files in N processes (default: the usable cores, at most one per file, fewer "
                        "when memory cannot hold that many files at once; 1 for inputs under 64 MB in all)")
    p.add_argument("--dask", metavar="ADDRESS",
                   help="run the per-file tasks on the Dask cluster at ADDRESS (tcp://host:8786; 'local': a "
                        "LocalCluster of --jobs workers); paths must be visible to the workers. Needs "
                        "dask[distributed]")
    return p


def main(argv: list[str] | None = None) -> int:
    from analysis.parallel import Progress, check_jobs, default_jobs
    from analysis.rank_merge import analyse_groups, concat_analyses, report_failures

    args = build_parser().parse_args(argv)
    try:
        patterns = Patterns(comm_kernel=args.comm_pattern, comm_range=args.comm_range_pattern,
                            backward=args.backward_pattern, step=args.step_pattern)
        check_jobs(args.jobs)
        if args.skip_steps < 0:
            raise TraceError(f"skip_steps={args.skip_steps}: must be >= 0")
        groups = _groups(args.paths, args.merge, args.export)
        files = [p for g in groups for p in g]
        big = sum(p.stat().st_size for p in files if p.is_file()) > 200 * 2**20
        progress = Progress(len(files), "[overlap]", after_s=0 if big else None)
        done = analyse_groups(groups, patterns, args.skip_steps, args.jobs or default_jobs(files), args.dask, progress)
    except TraceError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except MemoryError:
        print("error: out of memory while analysing the trace(s)", file=sys.stderr)
        return 2
    bad = report_failures(done)
    good = [g.merged for g in done if g.merged is not None]
    if not good:
        return 2
    result = concat_analyses([m.analysis for m in good])
    try:
        if args.format == "json":
            doc = result.to_json()
            if args.merge:  # the per-step view across the run's ranks
                doc["traces"][0]["steps_across_ranks"] = plain_records(good[0].across_ranks)
            print(json.dumps(doc))  # compact: the C encoder (indent= falls back to pure Python)
        elif args.format == "csv":
            frame = result.steps if args.per_step else per_rank_table(result)  # the table's rows
            print(frame.to_csv(index=False), end="")
        else:
            print(render_table(result, args.per_step))
            if args.merge and args.per_step and len(good[0].across_ranks):
                print("\nper step across ranks (a step is as slow as its slowest rank; skew: last minus first "
                      "rank to start/end it, clocks aligned):")
                print(_fmt(good[0].across_ranks.drop(columns="path")))
    except BrokenPipeError:  # `| head`: the reader has all it wanted
        sys.stderr.close()
    return 2 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
