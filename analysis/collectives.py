"""Collectives view: what every collective moved, how fast, how late, and how much was waiting.

    python -m analysis.collectives TRACE... [--format table|csv|json] [--rank R] [--step N] [--peak-busbw GBPS]

One row per collective call per rank (collective_calls.py finds them, pairing.py pairs them across
ranks into wait and transfer, collective_stats.py adds bandwidths and summaries). Python API:
`analyze_collectives(paths) -> CollectivesView` with `.calls`, `.by_size`, `.by_rank`, `.stragglers`
and `.traces` DataFrames; `collectives_of(trace)` does one loaded trace.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from analysis import collective_stats as stats
from analysis.collective_rows import call_rows
from analysis.errors import TraceError
from analysis.overlap import plain_records
from analysis.patterns import Patterns
from analysis.trace import Trace, load_trace
from contract import COMM_FORM

TABLE_ROWS = {"rank": "rank", "step": "step", "phase": "phase", "op": "op", "tag": "tag", "bytes": "bytes",
              "issue_ms": "issue ms", "start_ms": "start ms", "end_ms": "end ms", "duration_ms": "duration ms",
              "wait_ms": "wait ms", "transfer_ms": "transfer ms", "busbw_gbps": "busbw GB/s",
              "exposed_ms": "exposed ms"}
SUMMARY_TABLE = ["calls", "bytes", "duration_ms", "wait_ms", "transfer_ms", "median_busbw_gbps", "p90_busbw_gbps",
                 "wait_share", "exposed_share"]


@dataclass(frozen=True)
class CollectivesView:
    """`calls`: one row per call per rank (ROW_COLUMNS); `by_size`: per trace, op and size class;
    `by_rank`: per trace and rank; `stragglers`: per trace and step; `traces`: per trace, with
    source, world size, ranks present and a note when calls lack partners."""

    calls: pd.DataFrame
    by_size: pd.DataFrame
    by_rank: pd.DataFrame
    stragglers: pd.DataFrame
    traces: pd.DataFrame

    def to_json(self) -> dict:
        """{"traces": [{facts..., "calls": [...], "by_size": [...], "by_rank": [...], "stragglers": [...]}]}."""
        parts = {"calls": self.calls, "by_size": self.by_size, "by_rank": self.by_rank, "stragglers": self.stragglers}
        out = []
        for head in plain_records(self.traces):
            mine = {name: _records(f[f["path"] == head["path"]].drop(columns="path")) for name, f in parts.items()}
            out.append({**head, **mine})
        return {"traces": out}


def _records(frame: pd.DataFrame) -> list[dict]:
    """Rows as JSON-safe dicts (NaN -> None), encoded by pandas in C rather than row by row."""
    return json.loads(frame.to_json(orient="records", double_precision=15))


def _summaries(calls: pd.DataFrame, peak: float | None) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    by_size, by_rank, strag = [], [], []
    for path, mine in calls.groupby("path", sort=False):  # one iteration per trace
        by_size.append(stats.by_size(mine).assign(path=path))
        by_rank.append(stats.by_rank(mine).assign(path=path))
        strag.append(stats.stragglers(mine).assign(path=path))
    frames = [pd.concat(f, ignore_index=True) if f else pd.DataFrame(columns=["path"])
              for f in (by_size, by_rank, strag)]
    if peak:
        for f in frames[:2]:
            f["median_busbw_pct_peak"] = 100.0 * f["median_busbw_gbps"] / peak
    return frames[0], frames[1], frames[2]


def collectives_of(traces: Iterable[Trace], patterns: Patterns | None = None, rank: int | None = None,
                   step: int | None = None, peak_busbw: float | None = None) -> CollectivesView:
    """The view of loaded traces; rank/step keep only that rank's/step's calls (stragglers use every
    rank of the kept steps); peak_busbw (GB/s) adds busbw as % of that peak."""
    rows, facts = zip(*(call_rows(t, patterns) for t in traces), strict=True)
    calls = pd.concat(rows, ignore_index=True)
    for name, value in (("step", step), ("rank", rank)):
        have = sorted(calls[name].unique().tolist())
        if value is not None and value not in have:
            raise TraceError(f"--{name} {value}: no collective call has it (the trace(s) have {name}s {have})")
    if step is not None:
        calls = calls[calls["step"] == step]
    if peak_busbw:
        calls = calls.assign(busbw_pct_peak=100.0 * calls["busbw_gbps"] / peak_busbw)
    every_rank = calls
    if rank is not None:
        calls = calls[calls["rank"] == rank]
    by_size, by_rank, _ = _summaries(calls, peak_busbw)
    stragglers = _summaries(every_rank, None)[2]
    return CollectivesView(calls.reset_index(drop=True), by_size, by_rank, stragglers, pd.DataFrame(list(facts)))


def analyze_collectives(paths: str | Path | Iterable[str | Path], patterns: Patterns | None = None,
                        merge: bool = False, **options: Any) -> CollectivesView:
    """Each path its own trace, or (merge=True) all paths one run (one rank per file); options as collectives_of."""
    paths = [Path(paths)] if isinstance(paths, (str, Path)) else [Path(p) for p in paths]
    groups = [paths] if merge else [[p] for p in paths]
    return collectives_of((load_trace(g, patterns) for g in groups), patterns, **options)


def _fmt(frame: pd.DataFrame, names: dict | None = None) -> str:
    if frame.empty:
        return "(none)"
    shown = frame.rename(columns=names or {c: c.replace("_gbps", " GB/s").replace("_ms", " ms").replace("_", " ")
                                           for c in frame})
    return shown.to_string(index=False, float_format=lambda v: f"{v:.3f}", na_rep="-")


def _with_bytes_text(frame: pd.DataFrame) -> pd.DataFrame:
    """bytes as whole numbers, '-' when unknown (a float column would print 4000000.000)."""
    b = frame["bytes"].to_numpy(dtype=float)
    return frame.assign(bytes=np.where(np.isnan(b), "-", np.nan_to_num(b).astype(np.int64).astype(str)))


def render_table(view: CollectivesView, summary_only: bool) -> str:
    out = []
    several = len(view.traces) > 1
    lead = ["implementation"] if several else []
    if not summary_only:
        calls = _with_bytes_text(view.calls[lead + list(TABLE_ROWS)])
        out += ["calls (one row per collective call per rank):", _fmt(calls, TABLE_ROWS), ""]
    impl = dict(zip(view.traces["path"], view.traces["implementation"], strict=True))
    for title, frame, keys in (("by op and message size (all calls of all ranks):", view.by_size, ["op", "size_class"]),
                               ("by rank:", view.by_rank, ["rank"])):
        extra = [c for c in ("median_busbw_pct_peak",) if c in frame]
        shown = frame.assign(implementation=frame["path"].map(impl))[[*lead, *keys, *SUMMARY_TABLE, *extra]]
        out += [title, _fmt(_with_bytes_text(shown)), ""]
    strag = view.stragglers.assign(implementation=view.stragglers["path"].map(impl))
    out += ["stragglers per step (the rank the others waited for; paired collectives only):",
            _fmt(strag[[*lead, "step", "collectives", "straggler", "times_last", "wait_caused_ms", "wait_ms"]])]
    for head in view.traces.itertuples():
        source = "kernels" if head.source == "kernel" else f"{COMM_FORM} ranges (no communication kernels)"
        out.append(f"\n{head.implementation}: {head.calls} calls from {source}, world size {head.world_size}, "
                   f"{head.ranks} ranks in the trace" + (f"; note: {head.note}" if head.note else ""))
    return "\n".join(out)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m analysis.collectives",
        description="Every collective call of every rank in Nsight Systems SQLite exports: op, tag (parameter or "
                    "bucket), bytes, issue time, kernel start/end, and, paired across ranks (the k-th call of an "
                    "op in a step on each rank is one collective), the wait for the last rank to arrive, the "
                    "transfer after it, bus bandwidth (nccl-tests factors) and the part with no compute under it. "
                    "Summaries per op and message size, per rank, and the straggler rank of each step. Times are "
                    "ms on the trace's clock. Traces without communication kernels (CPU, gloo) use the "
                    f"{COMM_FORM} ranges: arrival = issue, end = completion as seen by the rank.",
        epilog="Exit status: 0 ok, 2 bad input (message on stderr).")
    p.add_argument("paths", nargs="+", metavar="TRACE", help="nsys SQLite export(s)")
    p.add_argument("--format", choices=["table", "csv", "json"], default="table",
                   help="table: calls then summaries; csv: the per-call rows, every column; json: calls, summaries "
                        "and stragglers per trace")
    p.add_argument("--rank", type=int, metavar="R", help="only rank R's calls (pairing still uses every rank)")
    p.add_argument("--step", type=int, metavar="N", help="only the calls issued in step N")
    p.add_argument("--peak-busbw", type=float, metavar="GBPS",
                   help="the interconnect's peak bus bandwidth in GB/s: adds busbw as %% of it")
    p.add_argument("--summary", action="store_true", help="table: summaries only, no per-call rows")
    p.add_argument("--merge", action="store_true",
                   help="treat all TRACEs as one run (one rank per file, clocks aligned)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.peak_busbw is not None and not args.peak_busbw > 0:
            raise TraceError(f"--peak-busbw {args.peak_busbw}: must be a positive number of GB/s")
        view = analyze_collectives(args.paths, merge=args.merge, rank=args.rank, step=args.step,
                                   peak_busbw=args.peak_busbw)
    except TraceError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except MemoryError:
        print("error: out of memory while reading the trace(s)", file=sys.stderr)
        return 2
    try:
        if args.format == "json":
            print(json.dumps(view.to_json()))
        elif args.format == "csv":
            print(view.calls.to_csv(index=False), end="")
        else:
            print(render_table(view, args.summary))
    except BrokenPipeError:  # `| head`: the reader has all it wanted
        sys.stderr.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
