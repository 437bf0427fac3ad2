"""Comparison report across implementations, written into one folder and nowhere else.

    python -m analysis.report traces/*.sqlite -o reports/

Writes into the -o folder: index.html (ranking table, per-step breakdown, step spread, links),
timelines/<trace>.html (one per trace, all steps) and timelines/naive_vs_<best>.html (one step of
each, stacked), summary.csv (one row per trace) and results.db (SQLite: tables traces, ranks,
steps keyed by trace path + content hash, so re-runs add history without duplicating rows).
Refuses to overwrite files there that it did not write. Exit codes: 0 written, 2 bad input.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sqlite3
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from analysis.errors import TraceError
from analysis.html_page import written_by_us
from analysis.html_report import write_index
from analysis.lanes import Selection
from analysis.overlap import plain_records
from analysis.timeline import TraceInput, group_inputs

if TYPE_CHECKING:
    from sqlite_utils import Database

    from analysis.overlap import Analysis
    from analysis.rank_merge import FileResult
    from analysis.trace import Trace

SUMMARY_COLUMNS = ["implementation", "trace", "ranks", "steps", "step_ms", "compute_ms", "comm_ms",
                   "overlap_ms", "exposed_comm_ms", "idle_ms", "overlap_pct", "speedup_vs_naive", "sha256"]
FORMATS = ("table", "csv", "json")


@dataclass(frozen=True)
class Analysed:
    """One input trace: its label (the path, or the rank files' pattern), content hash, trace, analysis."""

    path: str
    name: str
    sha256: str
    trace: Trace | None  # None: the analysis ran file by file and the timelines load the trace again
    analysis: Analysis
    paths: tuple = ()


def progress(message: str) -> None:
    print(f"[report] {message}", file=sys.stderr, flush=True)


def content_hash(path: Path) -> str:
    """sha256 of the file's bytes, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def group_sha256(hashes: list[str]) -> str:
    """A trace's hash: its file's, or for per-rank files the sha256 of their hashes joined."""
    return hashes[0] if len(hashes) == 1 else hashlib.sha256("".join(hashes).encode()).hexdigest()


def hashed_file(path: Path) -> FileResult:
    """One file's analysis with its content hash (runs in worker processes: see analysis/parallel.py)."""
    from dataclasses import replace

    from analysis.rank_merge import analyse_file
    return replace(analyse_file(path), sha256=content_hash(path))


def analyse_all(inputs: list[TraceInput], jobs: int | None, dask: str | None) -> tuple[list[Analysed], list[str]]:
    """Every file of every input analysed on its own (here, in --jobs processes or on --dask), per-rank
    files merged from their results; prints each bad file's error and returns (results, bad files)."""
    from analysis.parallel import Progress, check_jobs, default_jobs
    from analysis.rank_merge import analyse_groups, report_failures

    check_jobs(jobs)
    files = [p for inp in inputs for p in inp.paths]
    done = analyse_groups([list(inp.paths) for inp in inputs], jobs=jobs or default_jobs(files), dask=dask,
                          progress=Progress(len(files), "[report]"), task=hashed_file)
    bad = report_failures(done)
    results = [Analysed(inp.label, inp.name, group_sha256([f.sha256 for f in g.files] or
                                                          [content_hash(p) for p in inp.paths]),  # merged runs
                        None, g.merged.analysis, inp.paths) for inp, g in zip(inputs, done, strict=True)
               if g.merged is not None]
    return results, bad


def loaded_trace(result: Analysed) -> Trace:
    """The result's trace, loaded again when the analysis did not keep it."""
    from analysis.trace import load_trace

    return result.trace if result.trace is not None else load_trace(list(result.paths))


def summary_frame(results: list[Analysed]) -> pd.DataFrame:
    """One row per trace, fastest first, with labels unique across traces and speedup over naive."""
    rows = [{**r.analysis.summary.iloc[0].to_dict(), "trace": str(r.path), "sha256": r.sha256} for r in results]
    frame = pd.DataFrame(rows)
    dup = frame["implementation"].duplicated(keep=False)
    frame["label"] = np.where(dup, frame["implementation"] + " (" + frame["trace"].map(lambda p: Path(p).stem) + ")",
                              frame["implementation"])
    naive = frame.loc[frame["implementation"] == "naive", "step_ms"]
    frame["speedup_vs_naive"] = naive.iloc[0] / frame["step_ms"] if len(naive) else np.nan
    return frame.sort_values("step_ms", kind="stable", na_position="last").reset_index(drop=True)


def steps_frame(results: list[Analysed], summary: pd.DataFrame) -> pd.DataFrame:
    """Every (trace, rank, step) row of the analyses with the trace's label."""
    labels = dict(zip(summary["trace"], summary["label"], strict=True))
    return pd.concat([r.analysis.steps.assign(label=labels[str(r.path)], trace=str(r.path), sha256=r.sha256)
                      for r in results], ignore_index=True)


def timeline_names(traces: list[tuple[str, str]]) -> dict[str, str]:
    """timelines/<name>.html per (label, name) of a trace, numbered when two traces share a name."""
    names: dict[str, str] = {}
    seen: dict[str, int] = {}
    for label, name in traces:
        n = seen.get(name, 0)
        seen[name] = n + 1
        names[label] = f"timelines/{name}{'' if n == 0 else f'_{n}'}.html"
    return names


def common_step(a: Analysed, b: Analysed) -> int | None:
    """A step number both traces have (the middle one, past warm-up), or None."""
    have = [set(r.analysis.steps["step"].dropna().astype(int)) for r in (a, b)]
    common = sorted(have[0] & have[1])
    return common[len(common) // 2] if common else None


def check_out_dir(out: Path, html_names: list[str]) -> None:
    """Refuse an -o that is a file, and files inside it this tool did not write (pages without our
    generator mark, a summary.csv with other headers, a results.db that is not SQLite)."""
    if out.exists() and not out.is_dir():
        raise TraceError(f"-o {out}: is a file, expected a folder for the report")
    for name in ["index.html", *html_names]:
        page = out / name
        if page.exists() and (page.is_dir() or not written_by_us(page)):
            raise TraceError(f"{page}: exists and was not written by this tool; refusing to overwrite it "
                             "(choose another -o folder)")
    csv = out / "summary.csv"
    if csv.exists() and not _starts_with(csv, ",".join(SUMMARY_COLUMNS[:3]).encode()):
        raise TraceError(f"{csv}: exists and is not a report summary; refusing to overwrite it")
    db = out / "results.db"
    if db.exists() and not _starts_with(db, b"SQLite format 3"):
        raise TraceError(f"{db}: exists and is not an SQLite database; refusing to touch it")


def _starts_with(path: Path, head: bytes) -> bool:
    """Whether a file's first bytes are `head` (reads only those bytes; a folder never matches)."""
    if not path.is_file():
        return False
    with open(path, "rb") as f:
        return f.read(len(head)) == head


HISTORY_KEYS = {"traces": ["path", "sha256"], "ranks": ["path", "sha256", "rank"],
                "steps": ["path", "sha256", "rank", "step"]}


def record_history(db_path: Path, results: list[Analysed], summary: pd.DataFrame) -> None:
    """Upsert traces, ranks and steps keyed by (path, sha256): re-runs add history, never duplicates.

    Raises TraceError (before writing anything) when a table exists keyed differently, and when
    SQLite or sqlite-utils fails while writing.
    """
    import sqlite_utils
    import sqlite_utils.db as su

    failures = (sqlite3.Error, su.AlterError, su.BadPrimaryKey, su.InvalidColumns, su.PrimaryKeyRequired,
                su.TransactionError, su.NotFoundError)
    try:
        with sqlite_utils.Database(db_path) as db:  # the with-block closes the connection
            _check_history_tables(db, db_path)
            _upsert_history(db, results, summary)
    except failures as e:
        raise TraceError(f"{db_path}: cannot record the results ({type(e).__name__}: {e})") from None


def _check_history_tables(db: Database, db_path: Path) -> None:
    """Refuse a results.db whose traces/ranks/steps tables are keyed otherwise than ours."""
    for name, keys in HISTORY_KEYS.items():
        table = db.table(name)  # db[name] would be a View for a view of that name: no keys, no upsert
        if table.exists() and table.pks != keys:
            raise TraceError(f"{db_path}: table {name} is keyed by {table.pks}, not {keys}; not a results "
                             "database of this tool (choose another -o folder)")


def _upsert_history(db: Database, results: list[Analysed], summary: pd.DataFrame) -> None:
    now = datetime.now(timezone.utc).isoformat(timespec="seconds")
    traces = summary.drop(columns=["trace", "label"]).assign(path=summary["trace"], analysed_at=now)
    db.table("traces").upsert_all(plain_records(traces), pk=HISTORY_KEYS["traces"], alter=True)
    for r in results:
        base = {"path": str(r.path), "sha256": r.sha256}
        ranks = r.analysis.totals.drop(columns=["path"]).assign(**base)
        db.table("ranks").upsert_all(plain_records(ranks), pk=HISTORY_KEYS["ranks"], alter=True)
        steps = r.analysis.steps.drop(columns=["path"]).assign(**base)
        steps["step"] = steps["step"].fillna(-1).astype(np.int64)  # -1: the whole capture
        db.table("steps").upsert_all(plain_records(steps), pk=HISTORY_KEYS["steps"], alter=True)


@dataclass(frozen=True)
class SidePage:
    """The naive-vs-best timeline: its file name inside the report, title and the two traces."""

    name: str
    title: str
    naive: str
    best: str


def side_page(summary: pd.DataFrame) -> SidePage | None:
    """naive and the fastest other implementation (summary is sorted fastest first), or None."""
    naive = summary.loc[summary["implementation"] == "naive", "trace"]
    others = summary.loc[summary["implementation"] != "naive"]
    if naive.empty or others.empty:
        return None
    best = others.iloc[0]
    return SidePage(f"timelines/naive_vs_{best['label'].split(' ')[0]}.html", f"naive vs {best['label']}",
                    naive.iloc[0], best["trace"])


def write_timelines(out: Path, results: list[Analysed], side: SidePage | None) -> dict:
    """One overview timeline per trace plus the naive-vs-best side by side; returns the per-trace links."""
    from analysis.timeline import trace_panel, write_timeline

    names = timeline_names([(r.path, r.name) for r in results])
    by_trace = {r.path: r for r in results}
    for r in results:
        t0 = time.perf_counter()
        trace = loaded_trace(r)
        panel, _ = trace_panel(r.path, Selection(), trace=trace, steps=r.analysis.steps)
        write_timeline([panel], out / names[r.path], f"Timeline: {trace.implementation}", Selection())
        progress(f"timeline of {r.path} ({time.perf_counter() - t0:.1f} s)")
    if side is not None:
        a, b = by_trace[side.naive], by_trace[side.best]
        selection = Selection(step=common_step(a, b))
        panels = [trace_panel(r.path, selection, trace=loaded_trace(r), steps=r.analysis.steps)[0] for r in (a, b)]
        write_timeline(panels, out / side.name, f"Timeline: {side.title}", selection)
    return names


def collectives_blocks(results: list[Analysed], summary: pd.DataFrame, args: argparse.Namespace) -> list:
    """The index page's Collectives section (report_collectives.py), one entry per trace."""
    from analysis.collectives import collectives_of
    from analysis.report_collectives import collectives_section

    labels = dict(zip(summary["trace"], summary["label"], strict=True))
    traces = [loaded_trace(r) for r in results]  # the analysis ran file by file and kept no events
    entries = [(labels[str(r.path)], t, collectives_of([t])) for r, t in zip(results, traces, strict=True)]
    return collectives_section(entries, args.peak_busbw)


def print_summary(summary: pd.DataFrame, fmt: str) -> None:
    shown = summary[SUMMARY_COLUMNS]
    if fmt == "json":
        print(json.dumps(plain_records(shown), indent=2))
    elif fmt == "csv":
        print(shown.to_csv(index=False), end="")
    else:
        print(shown.drop(columns=["sha256"]).to_string(index=False, float_format=lambda v: f"{v:.3f}", na_rep="-"))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m analysis.report",
        epilog="Exit codes: 0 written, 2 bad input (the message says which). Progress goes to stderr.",
        description="Compare implementations from nsys SQLite exports: writes index.html (ranking table, "
                    "per-step time breakdown, step spread, timeline links), one timeline per trace, a "
                    "naive-vs-best timeline, summary.csv and results.db into the -o folder, and nothing "
                    "outside it. Prints the summary table.",
    )
    ap.add_argument("traces", nargs="+", type=Path,
                    help="nsys SQLite exports, one per implementation; <impl>.rank<N>.sqlite files of one folder "
                         "(run_nsys.sh --per-rank) are merged into one trace")
    ap.add_argument("-o", "--output", type=Path, default=Path("reports"), help="report folder (default reports/)")
    ap.add_argument("--format", choices=FORMATS, default="table", help="summary output format (default table)")
    ap.add_argument("--no-timelines", action="store_true", help="skip the timeline pages (faster)")
    ap.add_argument("--peak-busbw", type=float, metavar="GBPS",
                    help="draw this peak bus bandwidth (GB/s) on the Collectives section's bandwidth plot")
    ap.add_argument("--jobs", type=int, default=None, metavar="N",
                    help="analyse files in N processes (default: the usable cores, at most one per file, fewer when "
                         "memory cannot hold that many at once; 1 for inputs under 64 MB in all); results.db is "
                         "written by this process alone")
    ap.add_argument("--dask", metavar="ADDRESS",
                    help="analyse the files on the Dask cluster at ADDRESS (tcp://host:8786, or 'local'); paths must "
                         "be visible to the workers. Needs dask[distributed]")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = args.output
    try:
        if len({p.resolve() for p in args.traces}) != len(args.traces):
            raise TraceError("the same trace is given twice")
        if args.peak_busbw is not None and not args.peak_busbw > 0:
            raise TraceError(f"--peak-busbw {args.peak_busbw}: must be a positive number of GB/s")
        inputs = group_inputs(args.traces)
        pages = [] if args.no_timelines else list(timeline_names([(i.label, i.name) for i in inputs]).values())
        check_out_dir(out, pages)  # fail before the (slow) analysis when we can
        results, bad = analyse_all(inputs, args.jobs, args.dask)
        if bad:
            return 2  # each bad file's error is printed above; nothing is written
        summary = summary_frame(results)
        side = None if args.no_timelines else side_page(summary)
        check_out_dir(out, pages + ([side.name] if side else []))  # every output, before writing any
        out.mkdir(parents=True, exist_ok=True)
        record_history(out / "results.db", results, summary)  # first: the one that can refuse late
        links = {} if args.no_timelines else write_timelines(out, results, side)
        index = write_index(out / "index.html", summary, steps_frame(results, summary), links,
                            (side.name, side.title) if side else None, collectives_blocks(results, summary, args))
        summary[SUMMARY_COLUMNS].to_csv(out / "summary.csv", index=False)
        progress(f"wrote {out / 'results.db'}, {index}, {out / 'summary.csv'}")
    except TraceError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"error: {e.filename or ''}: {e.strerror or e}", file=sys.stderr)
        return 2
    try:
        print_summary(summary, args.format)
    except BrokenPipeError:  # `| head` closed stdout: the report is written, nothing more to say
        sys.stderr.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
