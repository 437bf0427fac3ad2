"""Read one large SQLite table on several threads: `table_chunks`, `read_table`.

The table's rowid range is cut into chunks (at most CHUNK_ROWS rowids each, and at least one per
worker once the table is worth splitting); each chunk is one connectorx query run on a worker thread,
and the chunks come back in rowid order, which is the order a full scan of a rowid table gives, so
the columns equal a one-query read's. Why threads help: connectorx releases the GIL for the whole of
an Arrow read (not for a streamed one, which is why this replaced the streamed read), so on two cores
two chunks decode at once, and the first read overlaps whatever the main thread does meanwhile.
At most one chunk per worker is waiting for the consumer: memory stays a few chunks above the result.
`start_chunks` starts a table's first chunks before anyone asks (nsys_db.NsysExport.start_reading);
a read given them as `ahead` takes each started query's result instead of reading it again.
Without connectorx, past sqlite_read's thread cap, or when a chunk's query fails in connectorx, that
chunk is read with sqlite3 on the caller's connection (and gives the same arrays).
"""

from __future__ import annotations

import itertools
import multiprocessing
import sqlite3
import threading
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np

from analysis.machine import release_free_memory, usable_cores
from analysis.trace.readers import sqlite_read

CHUNK_ROWS = 1 << 19  # rowids per chunk: its transient Arrow memory; connectorx reads 2 x 512k rows faster than 1M
SPLIT_ROWS = 1 << 16  # a table with fewer rowids is read in one query: a thread would cost more than it saves


def read_workers() -> int:
    """Threads a table is read with: the usable cores, or 1 in a process or thread that is itself one of
    several reading at once (a --jobs worker process, a Dask task thread)."""
    if multiprocessing.current_process().daemon or threading.current_thread() is not threading.main_thread():
        return 1
    return usable_cores()


def chunk_queries(conn: sqlite3.Connection, table: str, exprs: list[str], where: str | None = None) -> list[str]:
    """`SELECT exprs FROM table [WHERE where]` as queries over consecutive rowid ranges, in rowid order
    (one query, without a range, for a small, empty or WITHOUT ROWID table)."""
    select = f'SELECT {", ".join(exprs)} FROM "{table}"'
    whole = [f"{select} WHERE {where}" if where else select]
    try:
        # two subqueries: SQLite reads a lone min() or max() of the rowid off the B-tree's end, but scans
        # the whole table for both in one SELECT
        ends = f'SELECT (SELECT min(rowid) FROM "{table}"), (SELECT max(rowid) FROM "{table}")'
        lo, hi = conn.execute(ends).fetchone()
    except sqlite3.DatabaseError:  # no rowid (WITHOUT ROWID): one query
        return whole
    if lo is None or hi - lo + 1 < SPLIT_ROWS:
        return whole
    span = hi - lo + 1
    chunks = max(-(-span // CHUNK_ROWS), read_workers())
    edges = [lo + span * i // chunks for i in range(chunks + 1)]
    also = f" AND ({where})" if where else ""
    return [f"{select} WHERE rowid >= {a} AND rowid < {b}{also}" for a, b in itertools.pairwise(edges)]


def table_chunks(
    path: Path,
    conn: sqlite3.Connection,
    table: str,
    exprs: list[str],
    names: list[str],
    where: str | None = None,
    narrow: dict[str, type] | None = None,
    null_int: int = -1,
    *,
    ahead: dict[str, Future] | None = None,
) -> Iterator[dict[str, np.ndarray]]:
    """The table's rows (the SELECT of `exprs`, optionally filtered by `where`) as chunks of columns in
    rowid order, each keyed by `names` and typed as sqlite_read.read_columns types a result. `ahead`:
    chunk reads already started (start_chunks), taken out of it as they are used."""
    queries = chunk_queries(conn, table, exprs, where)
    return _read_queries(path, conn, queries, names, narrow, null_int, ahead or {})


def start_chunks(
    pool: ThreadPoolExecutor, path: Path, conn: sqlite3.Connection, table: str, exprs: list[str], names: list[str],
    where: str | None = None, narrow: dict[str, type] | None = None, null_int: int = -1,
) -> dict[str, Future]:  # fmt: skip
    """Start reading the table's first chunks (one per worker) on `pool`'s threads, before anyone asks:
    {query: Future}, the `ahead` of a later table_chunks or read_table of the same table."""
    queries = chunk_queries(conn, table, exprs, where)[: read_workers()]
    return {sql: pool.submit(_read_chunk, path, sql, names, null_int, narrow or {}) for sql in queries}


def _read_queries(
    path: Path, conn: sqlite3.Connection, queries: list[str], names: list[str], narrow: dict[str, type] | None,
    null_int: int, ahead: dict[str, Future],
) -> Iterator[dict[str, np.ndarray]]:  # fmt: skip
    narrow = narrow or {}
    read = lambda sql: _read_chunk(path, sql, names, null_int, narrow)
    workers = min(len(queries), read_workers())
    with ThreadPoolExecutor(workers, thread_name_prefix="sqlite-chunk") as pool:
        waiting: deque[tuple[str, Future]] = deque()
        todo = iter(queries)
        while True:
            while len(waiting) < workers and (sql := next(todo, None)) is not None:
                started = ahead.pop(sql, None)
                waiting.append((sql, started or pool.submit(read, sql)))
            if not waiting:
                return
            sql, future = waiting.popleft()
            yield _or_sqlite3(future.result(), conn, sql, names, null_int, narrow, path)


def read_table(
    path: Path,
    conn: sqlite3.Connection,
    table: str,
    exprs: list[str],
    names: list[str],
    where: str | None = None,
    narrow: dict[str, type] | None = None,
    null_int: int = -1,
    *,
    ahead: dict[str, Future] | None = None,
) -> dict[str, np.ndarray]:
    """table_chunks joined: each column one array (read_columns' types; a narrowed column stays narrow
    only where every chunk's values fit). Each chunk is copied into its place as it comes, while the
    next ones are read, into arrays sized from the first chunk (chunks span equal rowid ranges), rather
    than all chunks held and joined at the end: memory holds the result and a few chunks, not twice it."""
    queries = chunk_queries(conn, table, exprs, where)
    chunks = _read_queries(path, conn, queries, names, narrow, null_int, ahead or {})
    columns = {name: _Filling() for name in names}
    for chunk in chunks:
        for name in names:
            columns[name].add(chunk[name], len(queries))
        del chunk
    out = {name: columns.pop(name).result() for name in names}
    release_free_memory()
    return out


class _Filling:
    """One column's array, filled chunk by chunk (grown, or widened to a chunk's wider type, if need be)."""

    def __init__(self) -> None:
        self.values: np.ndarray | None = None
        self.n = 0

    def add(self, chunk: np.ndarray, chunks: int) -> None:
        if self.values is None:
            self.values = np.empty(len(chunk) * chunks + 1024, dtype=chunk.dtype)
        if chunk.dtype != self.values.dtype:  # a chunk kept wide (its values do not fit the narrow type)
            self.values = self.values.astype(np.result_type(self.values.dtype, chunk.dtype))
        if self.n + len(chunk) > len(self.values):
            grown = np.empty(2 * (self.n + len(chunk)), dtype=self.values.dtype)
            grown[: self.n] = self.values[: self.n]
            self.values = grown
        self.values[self.n : self.n + len(chunk)] = chunk
        self.n += len(chunk)

    def result(self) -> np.ndarray:
        """The filled rows, in an array of their own size when the estimate was more than 1/8 too large."""
        assert self.values is not None, "every read gives at least one chunk"
        filled = self.values[: self.n]
        return filled.copy() if self.n < len(self.values) * 7 // 8 else filled


def _read_chunk(path: Path, sql: str, names: list[str], null_int: int, narrow: dict[str, type]) -> dict | None:
    """One chunk through connectorx (on a worker thread); None when it cannot be read that way."""
    if sqlite_read.process_threads() >= sqlite_read.MAX_PROCESS_THREADS:
        return None
    try:
        return sqlite_read.read_connectorx(path, sql, names, null_int, narrow)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException:  # no connectorx, a type it cannot infer, or a Rust panic: sqlite3 reads it
        return None


def _or_sqlite3(
    chunk: dict | None, conn: sqlite3.Connection, sql: str, names: list[str], null_int: int, narrow: dict, path: Path
) -> dict[str, np.ndarray]:
    """The chunk connectorx read, else the same chunk read here with sqlite3."""
    return chunk if chunk is not None else sqlite_read.read_sqlite3(path, conn, sql, names, null_int, narrow)
