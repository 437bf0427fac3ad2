"""A run's first file read ahead (read.start_read, handed down by argument): the load takes the
started chunk reads instead of reading them again and gives the trace a plain load gives; what is not a
plain nsys export is only sniffed; what the load did not take is closed by OpenRuns."""

from __future__ import annotations

import gzip
import sqlite3
import threading

import pytest

from analysis import open_runs
from analysis.cache import key
from analysis.errors import TraceError
from analysis.run.loaded_run import load_trace
from analysis.trace.readers import sqlite_read
from analysis.trace.readers.read import start_read
from tests.analysis.cache.test_cache import assert_same_trace
from tests.support.synthetic_ddp import write_ddp_trace
from tests.support.synthetic_kineto import write_kineto_ddp_trace


@pytest.fixture
def export(tmp_path):
    return write_ddp_trace(tmp_path / "ddp.sqlite", n_kernels=4_000, n_ranks=2, n_steps=4)


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """(thread name, query) of every connectorx read."""
    pytest.importorskip("connectorx")
    monkeypatch.setattr(sqlite_read, "process_threads", lambda: 0)  # a long test process is past the thread cap
    seen: list[tuple[str, str]] = []
    real = sqlite_read.read_connectorx

    def counted(path, sql, *args, **kwargs):
        seen.append((threading.current_thread().name, sql))
        return real(path, sql, *args, **kwargs)

    monkeypatch.setattr(sqlite_read, "read_connectorx", counted)
    return seen


def test_the_load_takes_the_started_reads_and_gives_the_same_trace(export, reads):
    plain = load_trace(export, cache=False)
    plain_reads = sorted(sql for _, sql in reads)
    reads.clear()
    started = start_read(export)
    assert started.export is not None and started.sniffed.path == export
    got = load_trace(export, cache=False, started=started)
    assert_same_trace(plain, got)
    assert sorted(sql for _, sql in reads) == plain_reads  # every query read once: none again
    ahead = {sql for thread, sql in reads if thread.startswith("sqlite-ahead")}
    tables = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_RUNTIME")
    assert all(any(table in sql for sql in ahead) for table in tables), ahead
    with pytest.raises(sqlite3.ProgrammingError):  # the load closed the export it took
        started.export.conn.execute("SELECT 1")
    started.close()  # and closing it again is harmless


def test_what_is_not_a_plain_export_is_only_sniffed(tmp_path):
    kineto = write_kineto_ddp_trace(tmp_path / "k", 400, 1, 3, 2)[0]
    packed = tmp_path / "ddp.sqlite.gz"
    packed.write_bytes(gzip.compress(write_ddp_trace(tmp_path / "ddp.sqlite", 400, 1, 3, 2).read_bytes()))
    text = tmp_path / "notes.sqlite"
    text.write_text("not an export\n" * 20)
    for path, kind in ((kineto, "kineto"), (packed, "kineto"), (text, "nsys"), (tmp_path / "missing", "nsys")):
        started = start_read(path)
        assert started.export is None and started.sniffed.kind == kind, path
    with pytest.raises(TraceError, match="not an SQLite file"):  # the reader names what is wrong, as without
        load_trace(text, cache=False, started=start_read(text))


def test_open_runs_closes_a_started_read_the_cache_answered(export, monkeypatch):
    monkeypatch.delenv(key.NO_CACHE_ENV, raising=False)
    expected = open_runs([export]).overlap().steps  # the load is now in the cache
    started = start_read(export)
    assert started.export is not None
    got = open_runs([export], started=started).overlap().steps
    assert got.equals(expected)
    with pytest.raises(sqlite3.ProgrammingError):
        started.export.conn.execute("SELECT 1")
