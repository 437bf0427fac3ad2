"""Column reads from SQLite: connectorx and sqlite3 give the same arrays, and a process that has
piled up threads (connectorx leaves three per read) reads with sqlite3 instead of adding more."""

import sqlite3

import numpy as np
import pytest

from analysis.trace.readers import sqlite_read
from analysis.trace.readers.sqlite_read import process_threads, read_columns

SQL = "SELECT id, name FROM t ORDER BY id"


@pytest.fixture
def db(tmp_path):
    path = tmp_path / "t.sqlite"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE t (id INTEGER, name TEXT)")
    conn.executemany("INSERT INTO t VALUES (?, ?)", [(i, f"k{i % 3}") for i in range(50)] + [(None, "none")])
    conn.commit()
    yield path, conn
    conn.close()


def test_thread_guard_reads_with_sqlite3_alike(db, monkeypatch):
    path, conn = db
    fast = read_columns(path, conn, SQL, ["id", "name"])
    monkeypatch.setattr(sqlite_read, "MAX_PROCESS_THREADS", 0)
    monkeypatch.setattr(sqlite_read, "read_connectorx", lambda *a: pytest.fail("connectorx used past the limit"))
    slow = read_columns(path, conn, SQL, ["id", "name"])
    assert fast.keys() == slow.keys()
    for k in fast:
        np.testing.assert_array_equal(fast[k], slow[k])
    assert slow["id"].dtype == np.int64 and slow["id"][0] == -1  # NULL sorts first: the sentinel


def test_threads_stay_bounded_over_many_reads(db, monkeypatch):
    pytest.importorskip("connectorx")
    path, conn = db
    limit = process_threads() + 6
    monkeypatch.setattr(sqlite_read, "MAX_PROCESS_THREADS", limit)
    for _ in range(20):
        read_columns(path, conn, SQL, ["id", "name"])
    assert 0 < process_threads() < limit + 4  # one read past the check adds at most its pool's three
