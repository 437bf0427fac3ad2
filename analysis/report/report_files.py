"""The report folder's own files: refusing files this tool did not write, and the results.db history."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from analysis.errors import TraceError
from analysis.render.html_page import check_plotly_file, written_by_us
from analysis.render.table import plain_records

if TYPE_CHECKING:
    from sqlite_utils import Database

SUMMARY_COLUMNS = [
    "implementation",
    "trace",
    "ranks",
    "steps",
    "step_ms",
    "compute_ms",
    "comm_ms",
    "overlap_ms",
    "exposed_comm_ms",
    "idle_ms",
    "overlap_pct",
    "speedup_vs_naive",
    "ranks_note",
    "sha256",
]


def check_out_dir(out: Path, html_names: list[str], self_contained: bool = False) -> None:
    """Refuse an -o that is a file, and files inside it this tool did not write (pages without our
    generator mark, a summary.csv with other headers, a results.db that is not SQLite, a plotly.js
    bundle of other content unless the pages are self-contained)."""
    if out.exists() and not out.is_dir():
        raise TraceError(f"-o {out}: is a file, expected a folder for the report")
    for name in ["index.html", *html_names]:
        page = out / name
        if page.exists() and (page.is_dir() or not written_by_us(page)):
            raise TraceError(
                f"{page}: exists and was not written by this tool; refusing to overwrite it (choose another -o folder)"
            )
    if not self_contained:
        check_plotly_file(out)
    csv = out / "summary.csv"
    if csv.exists() and not _starts_with(csv, ",".join(SUMMARY_COLUMNS[:3]).encode()):
        raise TraceError(f"{csv}: exists and is not a report summary; refusing to overwrite it")
    db = out / "results.db"
    if db.exists() and not _starts_with(db, b"SQLite format 3"):
        raise TraceError(f"{db}: exists and is not an SQLite database; refusing to touch it")


def earlier_runs(out: Path) -> list[str]:
    """The runs (summary.csv's `trace` column: each run's path or rank-file pattern) of the report this
    tool wrote into `out` before; [] when there is none. Call after check_out_dir (the file is ours)."""
    csv = out / "summary.csv"
    if not csv.is_file():
        return []
    try:
        return [str(t) for t in pd.read_csv(csv, usecols=["trace"])["trace"]]
    except (ValueError, pd.errors.ParserError, pd.errors.EmptyDataError):
        return []


def _same_path(label: str) -> str:
    return os.path.normpath(os.path.abspath(label))


def check_replaces(out: Path, runs: Sequence[str], overwrite: bool) -> list[str]:
    """Refuse to replace a report of other runs: when `out` holds a report this tool wrote that shows a
    run not among `runs` (labels as given, compared as absolute paths), a TraceError naming what is
    there and how to proceed, unless `overwrite`. Returns the earlier report's runs."""
    before = earlier_runs(out)
    gone = [t for t in before if _same_path(t) not in {_same_path(r) for r in runs}]
    if gone and not overwrite:
        shown = ", ".join(gone[:3]) + (f" and {len(gone) - 3} more" if len(gone) > 3 else "")
        raise TraceError(
            f"-o {out}: holds the report of {len(before)} run{'s' if len(before) != 1 else ''} that this one would "
            f"replace ({shown} not among the inputs); choose a new -o folder, or pass --overwrite to replace it "
            "(the pages it wrote for them are removed)"
        )
    return before


def remove_stale(out: Path, kept: Sequence[Path]) -> list[Path]:
    """After a report replaced another (--overwrite): remove the pages the earlier report wrote that this
    one did not (timelines/*.html with our generator mark, and in img/ the images named as ours).
    Returns the files removed; nothing else in the folder is touched."""
    keep = {p.resolve() for p in kept}
    pages = [p for p in (out / "timelines").glob("*.html") if p.is_file() and written_by_us(p)]
    images = [
        p
        for p in (out / "img").glob("*")
        if p.is_file() and p.suffix in (".png", ".svg") and p.name.startswith(("index_", "timeline_", "side_by_side"))
    ]
    removed = [p for p in [*pages, *images] if p.resolve() not in keep]
    for p in removed:
        p.unlink()
    return removed


def _starts_with(path: Path, head: bytes) -> bool:
    """Whether a file's first bytes are `head` (reads only those bytes; a folder never matches)."""
    if not path.is_file():
        return False
    with open(path, "rb") as f:
        return f.read(len(head)) == head


HISTORY_KEYS = {
    "traces": ["path", "sha256"],
    "ranks": ["path", "sha256", "rank"],
    "steps": ["path", "sha256", "rank", "step"],
}


def record_history(db_path: Path, results: list, summary: pd.DataFrame) -> None:
    """Upsert traces, ranks and steps keyed by (path, sha256): re-runs add history, never duplicates.

    Raises TraceError (before writing anything) when a table exists keyed differently, and when
    SQLite or sqlite-utils fails while writing.
    """
    import sqlite_utils
    import sqlite_utils.db as su

    failures = (
        sqlite3.Error,
        su.AlterError,
        su.BadPrimaryKey,
        su.InvalidColumns,
        su.PrimaryKeyRequired,
        su.TransactionError,
        su.NotFoundError,
    )
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
            raise TraceError(
                f"{db_path}: table {name} is keyed by {table.pks}, not {keys}; not a results "
                "database of this tool (choose another -o folder)"
            )


def _upsert_history(db: Database, results: Sequence, summary: pd.DataFrame) -> None:
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
