"""Large tables read in rowid chunks on threads (sqlite_chunks.py): the same columns, in the same order,
as one sqlite3 query over the whole table, whatever the chunking, the gaps in the rowids or the reader."""

import sqlite3
import threading

import numpy as np
import pytest

from analysis.trace.readers import sqlite_chunks, sqlite_read
from analysis.trace.readers.sqlite_chunks import chunk_queries, read_table, read_workers, table_chunks

N = 100_000
EXPRS, NAMES = ["a", "b", "name", "a * 3"], ["a", "b", "name", "a3"]


@pytest.fixture
def db(tmp_path):
    path = tmp_path / "t.sqlite"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE t (a INTEGER, b INTEGER, name TEXT)")
    big = 3_000_000_000  # past int32: the chunk holding it keeps b wide
    rows = [(i, None if i % 7 == 0 else (big if i == N - 4 else -i), f"k{i % 5}") for i in range(N)]
    conn.executemany("INSERT INTO t VALUES (?, ?, ?)", rows)
    conn.execute("DELETE FROM t WHERE a % 1000 < 300 AND a > 50000")  # gaps in the rowids
    conn.commit()
    yield path, conn
    conn.close()


def whole(conn, where=None):
    """The reference: one plain query, rows to columns in Python, NULL as the reader's -1."""
    sql = f"SELECT {', '.join(EXPRS)} FROM t" + (f" WHERE {where}" if where else "")
    rows = conn.execute(sql).fetchall()
    return {n: [-1 if r[i] is None else r[i] for r in rows] for i, n in enumerate(NAMES)}


@pytest.mark.parametrize("chunk_rows", [1 << 19, 7_777])
@pytest.mark.parametrize("where", [None, "b IS NOT NULL AND name != 'k3'"])
def test_chunked_read_equals_one_query(db, monkeypatch, chunk_rows, where):
    path, conn = db
    monkeypatch.setattr(sqlite_chunks, "CHUNK_ROWS", chunk_rows)
    monkeypatch.setattr(sqlite_chunks, "SPLIT_ROWS", 1000)
    got = read_table(path, conn, "t", EXPRS, NAMES, where, narrow={"a": np.int32, "b": np.int32})
    assert {n: got[n].tolist() for n in NAMES} == whole(conn, where)
    assert got["a"].dtype == np.int32 and got["a3"].dtype == np.int64
    assert got["b"].dtype == np.int64  # one chunk holds 3e9: the column is not narrowed
    assert got["name"].dtype == object


def test_chunks_cover_the_rowids_once_in_order(db, monkeypatch):
    path, conn = db
    monkeypatch.setattr(sqlite_chunks, "CHUNK_ROWS", 10_000)
    monkeypatch.setattr(sqlite_chunks, "SPLIT_ROWS", 1000)
    queries = chunk_queries(conn, "t", ["rowid"])
    assert len(queries) == 10
    seen = [conn.execute(q).fetchall() for q in queries]
    rowids = [r[0] for chunk in seen for r in chunk]
    assert rowids == [r[0] for r in conn.execute("SELECT rowid FROM t")]  # every row once, in scan order
    chunks = list(table_chunks(path, conn, "t", ["rowid"], ["rowid"]))
    assert [c["rowid"].tolist() for c in chunks] == [[r[0] for r in chunk] for chunk in seen]


def test_small_empty_and_rowless_tables_are_one_query(db):
    path, conn = db
    conn.execute("CREATE TABLE e (a INTEGER)")
    conn.execute("CREATE TABLE w (a INTEGER PRIMARY KEY, b INTEGER) WITHOUT ROWID")
    conn.executemany("INSERT INTO w VALUES (?, ?)", [(i, 2 * i) for i in range(100_000)])
    conn.commit()
    assert chunk_queries(conn, "e", ["a"]) == ['SELECT a FROM "e"']
    assert chunk_queries(conn, "w", ["a", "b"], "b > 4") == ['SELECT a, b FROM "w" WHERE b > 4']
    assert read_table(path, conn, "e", ["a"], ["a"])["a"].size == 0
    got = read_table(path, conn, "w", ["a", "b"], ["a", "b"], "b > 4")
    assert got["a"].tolist() == list(range(3, 100_000)) and got["b"].tolist() == [2 * i for i in range(3, 100_000)]


def test_without_connectorx_each_chunk_is_read_with_sqlite3(db, monkeypatch):
    path, conn = db
    monkeypatch.setattr(sqlite_chunks, "CHUNK_ROWS", 9_000)
    monkeypatch.setattr(sqlite_chunks, "SPLIT_ROWS", 1000)
    fast = read_table(path, conn, "t", EXPRS, NAMES, narrow={"a": np.int32})

    def unavailable(*args):
        raise ImportError("connectorx missing")

    monkeypatch.setattr(sqlite_read, "read_connectorx", unavailable)
    slow = read_table(path, conn, "t", EXPRS, NAMES, narrow={"a": np.int32})
    for n in NAMES:
        assert fast[n].dtype == slow[n].dtype
        np.testing.assert_array_equal(fast[n], slow[n])


def test_a_thread_of_a_pool_reads_on_one_thread():
    assert read_workers() >= 1
    seen = []
    t = threading.Thread(target=lambda: seen.append(read_workers()))
    t.start()
    t.join()
    assert seen == [1]


def test_filling_widens_and_grows_like_a_concatenation():
    parts = [np.arange(5, dtype=np.int32), np.array([2**40, 7]), np.arange(50, dtype=np.int32)]
    column = sqlite_chunks._Filling()
    for p in parts:
        column.add(p, 2)  # sized from the first chunk: 2 x 5 (+ slack), grown for the third
    got = column.result()
    assert got.dtype == np.int64 and got.tolist() == np.concatenate(parts).tolist()
