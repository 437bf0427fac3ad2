"""Read-only access to an SQLite file: validation, schema introspection and fast column reads.

Columns come back as numpy arrays. connectorx (Rust, straight to Arrow) reads 1M rows x 7 columns
in about 0.55 s on the project machine against 2.2 s for sqlite3 `fetchall` + numpy, so it is used
when installed; the standard-library path is the fallback and gives identical arrays. A read here is
one query, whole; large tables are read in rowid chunks on several threads by sqlite_chunks.py.
SQLite NULLs in integer columns become `null_int` (a sentinel, default -1) so arrays stay int64 (or
the narrower type a caller asks for a column, where every value fits).
connectorx 0.4 leaves the three worker threads of each read's connection pool (r2d2) running until the
process ends: 27 for a 1M-kernel export (nine queries, chunks included), about 140 at 10M kernels. A
process that has piled up MAX_PROCESS_THREADS threads (a serial run over hundreds of files, a
long-lived Dask worker) reads with sqlite3 from then on.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from analysis.errors import TraceError
from analysis.trace.readers.nsys_export import is_report, report_error
from analysis.trace.readers.sniff import SQLITE_MAGIC

if TYPE_CHECKING:
    import pyarrow as pa

MAX_PROCESS_THREADS = 2048  # past this many threads in the process, no more connectorx reads (see above)


def check_sqlite_file(path: Path, head: bytes | None = None) -> None:
    """Raise TraceError unless `path` is an existing, non-empty file with an SQLite header; an Nsight
    Systems report (.nsys-rep, .qdrep) gets the exact `nsys export` command to run. `head`: the file's
    first bytes (at least 100) when the caller read them already (sniff.py), else they are read here."""
    if not path.exists():
        raise TraceError(f"{path}: no such file")
    if path.is_file() and is_report(path):
        raise report_error(path, export_option=False)
    if path.is_dir():
        raise TraceError(f"{path}: is a directory, expected an nsys SQLite export (.sqlite)")
    if not os.access(path, os.R_OK):
        raise TraceError(f"{path}: not readable")
    size = path.stat().st_size
    if size == 0:
        raise TraceError(f"{path}: empty file (0 bytes), expected an nsys SQLite export")
    if head is None or len(head) < min(size, 100):
        with open(path, "rb") as f:
            head = f.read(100)
    if not head.startswith(SQLITE_MAGIC):
        raise TraceError(f"{path}: not an SQLite file")
    page_size = int.from_bytes(head[16:18], "big") or 65536
    if page_size == 1:
        page_size = 65536
    pages = int.from_bytes(head[28:32], "big")
    if pages and size < pages * page_size:
        raise TraceError(f"{path}: truncated SQLite file ({size} of {pages * page_size} bytes)")


def connect_readonly(path: Path) -> sqlite3.Connection:
    """Open `path` read-only (immutable: SQLite then never writes a journal or lock file beside it)."""
    uri = Path(path).resolve().as_uri() + "?mode=ro&immutable=1"
    try:
        conn = sqlite3.connect(uri, uri=True)
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.DatabaseError as e:
        raise TraceError(f"{path}: unreadable SQLite file ({e})") from None
    return conn


def table_columns(conn: sqlite3.Connection) -> dict[str, set[str]]:
    """Every table in the file with its column names."""
    try:
        names = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        return {n: {r[1] for r in conn.execute(f'PRAGMA table_info("{n}")')} for n in names}
    except sqlite3.DatabaseError as e:
        raise TraceError(f"corrupt SQLite file ({e})") from None


def _arrow_to_numpy(column: pa.ChunkedArray | pa.Array, null_int: int, narrow: type | None = None) -> np.ndarray:
    # numpy's own array (malloc), not a view of Arrow's buffer in its default pool (mimalloc): memory that
    # pool frees stays with it while the analysis that follows allocates through malloc, so the two kept
    # about 50 MB more at the peak of a 1M-kernel file (555 vs 503 MB).
    import pyarrow as pa
    import pyarrow.compute as pc

    if pa.types.is_null(column.type):
        return narrowed(np.full(len(column), null_int, dtype=np.int64), narrow)
    if pa.types.is_integer(column.type):
        filled = pc.fill_null(column, null_int) if column.null_count else column
        values = filled.to_numpy().astype(np.int64, copy=False)
    elif pa.types.is_floating(column.type):
        values = column.to_numpy().astype(np.float64, copy=False)
    else:
        return np.asarray(column.to_pylist(), dtype=object)
    values = narrowed(values, narrow)
    return values if values.flags.owndata else values.copy()


def narrowed(values: np.ndarray, dtype: type | None) -> np.ndarray:
    """`values` (int64) as `dtype` when every value fits in it, else unchanged."""
    if dtype is None or values.dtype != np.int64 or values.size == 0:
        return values
    info = np.iinfo(dtype)
    return values.astype(dtype) if info.min <= values.min() and values.max() <= info.max else values


def process_threads() -> int:
    """This process's threads as the kernel counts them (Rust's included); 0 where /proc is absent."""
    try:
        with open("/proc/self/status") as f:
            return next((int(line.split()[1]) for line in f if line.startswith("Threads:")), 0)
    except OSError:
        return 0


def read_connectorx(
    path: Path, sql: str, names: list[str], null_int: int, narrow: dict[str, type]
) -> dict[str, np.ndarray]:
    """One query through connectorx, whole (the GIL is released while it reads), as numpy columns."""
    import connectorx as cx

    table = cx.read_sql("sqlite://" + str(Path(path).resolve()), sql, return_type="arrow")
    out = {}
    for i, name in enumerate(names):
        out[name] = _arrow_to_numpy(table.column(i), null_int, narrow.get(name))
    del table
    return out


def _read_sqlite3(conn: sqlite3.Connection, sql: str, names: list[str], null_int: int) -> dict[str, np.ndarray]:
    return _rows_to_columns(conn.execute(sql).fetchall(), names, null_int)


def _rows_to_columns(rows: list[tuple], names: list[str], null_int: int) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for i, name in enumerate(names):
        values = [r[i] for r in rows]
        if all(v is None or isinstance(v, int) for v in values):
            out[name] = np.array([null_int if v is None else v for v in values], dtype=np.int64)
        else:
            out[name] = np.array(values, dtype=object)
    return out


def read_sqlite3(
    path: Path, conn: sqlite3.Connection, sql: str, names: list[str], null_int: int, narrow: dict[str, type]
) -> dict[str, np.ndarray]:
    """One query through the standard library's sqlite3, typed as read_connectorx types it."""
    try:
        return {n: narrowed(c, narrow.get(n)) for n, c in _read_sqlite3(conn, sql, names, null_int).items()}
    except sqlite3.DatabaseError as e:
        raise TraceError(f"{path}: corrupt or truncated export ({e})") from None


def read_columns(
    path: Path,
    conn: sqlite3.Connection,
    sql: str,
    names: list[str],
    null_int: int = -1,
    narrow: dict[str, type] | None = None,
) -> dict[str, np.ndarray]:
    """Run a SELECT and return its columns as numpy arrays keyed by `names` (in SELECT order).

    Integer columns are int64 with NULL -> `null_int`, or the dtype `narrow` names for the column when
    every value fits in it; text columns are object arrays.
    """
    narrow = narrow or {}
    try:
        if process_threads() < MAX_PROCESS_THREADS:
            return read_connectorx(path, sql, names, null_int, narrow)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException:  # no connectorx, a type it cannot infer, or a Rust panic: use sqlite3
        pass
    return read_sqlite3(path, conn, sql, names, null_int, narrow)
