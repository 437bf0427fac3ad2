"""Reading ahead (trace/readers/read_ahead.py): the first file's tables start reading before the
analysis is imported; the load then takes the sniff, the open export and the chunks already read, so
each chunk is read once, the file is sniffed once and connected once, and the frames are a plain
load's. What the loader never takes is closed; files it cannot read are left to the loader's errors."""

from __future__ import annotations

import sqlite3
from collections import Counter

import pandas as pd
import pytest

from analysis.errors import TraceError
from analysis.run.loaded_run import load_trace
from analysis.timeline import command as timeline
from analysis.trace.readers import read_ahead, sqlite_chunks
from tests.support.synthetic_ddp import write_ddp_trace
from tests.support.synthetic_kineto import write_kineto_ddp_trace


@pytest.fixture
def export(tmp_path, monkeypatch):
    monkeypatch.setattr(sqlite_chunks, "SPLIT_ROWS", 100)  # a small export read in several chunks
    monkeypatch.setattr(sqlite_chunks, "CHUNK_ROWS", 700)
    yield write_ddp_trace(tmp_path / "run.sqlite", 3000, 2, 3, 2)
    read_ahead.discard()


@pytest.fixture
def queries(monkeypatch):
    """Every connectorx query, counted."""
    cx = pytest.importorskip("connectorx")
    seen: Counter = Counter()
    real = cx.read_sql

    def counted(uri, sql, *args, **kwargs):
        seen[sql] += 1
        return real(uri, sql, *args, **kwargs)

    monkeypatch.setattr(cx, "read_sql", counted)
    return seen


def test_a_load_read_ahead_equals_a_plain_load_and_reads_each_chunk_once(export, queries):
    plain = load_trace(export, cache=False)
    queries.clear()
    read_ahead.start(export)
    started = dict(read_ahead._OPENED[export].ahead)
    assert len(started) >= 4  # the first chunks of the kernel and runtime tables (one per worker)
    ahead = load_trace(export, cache=False)
    assert all(f.done() for f in started.values())
    chunked = [sql for sql in queries if "rowid >=" in sql]
    assert set(started) <= set(queries) and len(chunked) > len(started)  # the rest read by the loader
    assert max(queries.values()) == 1, queries  # no chunk read twice
    assert read_ahead._OPENED == {} and sqlite_chunks._AHEAD_POOL is None  # taken, and its threads ended
    pd.testing.assert_frame_equal(plain.gpu_ops, ahead.gpu_ops)
    pd.testing.assert_frame_equal(plain.nvtx, ahead.nvtx)


def test_what_the_loader_never_takes_is_closed(export):
    read_ahead.start(export)
    opened = read_ahead._OPENED[export]
    read_ahead.discard()
    assert read_ahead._OPENED == {} and opened.ahead == {} and sqlite_chunks._AHEAD_POOL is None
    with pytest.raises(sqlite3.ProgrammingError):
        opened.conn.execute("SELECT 1")


def test_files_it_cannot_read_are_left_to_the_loader(tmp_path):
    text = tmp_path / "notes.sqlite"
    text.write_text("not a database\n")
    for path in (tmp_path / "missing.sqlite", text, tmp_path):
        with pytest.raises(TraceError) as plain:
            load_trace(path, cache=False)
        read_ahead.start(path)  # no error here
        with pytest.raises(TraceError) as ahead:
            load_trace(path, cache=False)
        read_ahead.discard()
        assert str(ahead.value) == str(plain.value)


def test_a_kineto_file_is_sniffed_ahead_only(tmp_path):
    files = write_kineto_ddp_trace(tmp_path / "k", 400, 1, 3, 2)
    read_ahead.start(files[0])
    assert read_ahead._OPENED == {} and read_ahead.sniffed(files[0]).kineto
    assert len(load_trace(files[0], cache=False).gpu_ops) > 0
    read_ahead.discard()


def test_a_command_whose_load_is_cached_reads_nothing_ahead(export, queries, tmp_path, monkeypatch):
    monkeypatch.delenv("ANALYSIS_NO_CACHE", raising=False)
    out = tmp_path / "t.html"
    assert timeline.main([str(export), "-o", str(out)]) == 0  # the first look: read (ahead), then cached
    assert queries and read_ahead._OPENED == {}
    queries.clear()
    started = []
    monkeypatch.setattr(read_ahead, "start", lambda path: started.append(path))
    assert timeline.main([str(export), "-o", str(tmp_path / "t2.html")]) == 0
    assert started == [] and not queries  # the load came from the cache: the export was not read
