"""How often each command opens a trace file, counted per file: one sniff of its first bytes
(trace/readers/sniff.py), then for an nsys export one sqlite3 connection (the schema, metadata and the
fallback reads) and one connectorx connection per SELECT, a large table's chunks each a SELECT (connectorx
opens its own per query; kept because it reads the 1M-kernel export about 2.5x faster than one sqlite3
connection: docs/analysis.md), for a Kineto trace one read; the report also reads each file once whole,
for its sha256."""

from __future__ import annotations

import builtins
import sqlite3
from collections import Counter
from pathlib import Path

import pytest

from analysis.collectives import command as collectives
from analysis.overlap import command as overlap
from analysis.report import command as report
from analysis.timeline import command as timeline
from analysis.trace.readers import sqlite_read
from tests.support.synthetic_ddp import write_ddp_trace
from tests.support.synthetic_kineto import write_kineto_ddp_trace

NSYS_SELECTS = 7  # kernels, memcpy, memset, strings, runtime launches, NVTX, thread names


class Opens:
    """Counts, per trace file, the Python-level opens (`open`), sqlite3 connections and connectorx reads."""

    def __init__(self, monkeypatch, files: list[Path]):
        self.files = {str(f.resolve()): f.name for f in files}
        self.count: Counter = Counter()
        real_open, real_connect = builtins.open, sqlite3.connect
        monkeypatch.setattr(builtins, "open", self._wrap(real_open, "open"))
        monkeypatch.setattr(sqlite3, "connect", self._wrap(real_connect, "sqlite3"))
        cx = pytest.importorskip("connectorx")
        monkeypatch.setattr(cx, "read_sql", self._wrap(cx.read_sql, "connectorx"))

    def _wrap(self, real, kind: str):
        def counted(target, *args, **kwargs):
            self._note(target, kind)
            return real(target, *args, **kwargs)

        return counted

    def _note(self, target, kind: str) -> None:
        text = str(target)
        for prefix in ("sqlite://", "file://"):
            text = text.removeprefix(prefix)
        text = text.split("?")[0]
        if isinstance(target, (str, Path)) and text and Path(text).resolve().as_posix() in self.files:
            self.count[(self.files[Path(text).resolve().as_posix()], kind)] += 1

    def of(self, name: str) -> dict[str, int]:
        return {kind: n for (file, kind), n in self.count.items() if file == name}


@pytest.fixture(scope="module")
def nsys_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("opens")
    return [write_ddp_trace(d / f"run.rank{r}.sqlite", 400, 1, 3, 2, first_rank=r, world_size=2) for r in (0, 1)]


@pytest.mark.parametrize(
    "command",
    [
        (overlap.main, []),
        (collectives.main, []),
        (timeline.main, ["-o", "{out}/t.html"]),
        (report.main, ["-o", "{out}/report"]),
    ],
    ids=["overlap", "collectives", "timeline", "report"],
)
def test_each_nsys_file_is_sniffed_once_and_connected_once(nsys_run, command, tmp_path, monkeypatch, capsys):
    main, options = command
    # connectorx's leftover pool threads pile up over a long test process; past sqlite_read's thread cap
    # (its own test) every read goes through sqlite3: counted here is the path a fresh command takes
    monkeypatch.setattr(sqlite_read, "process_threads", lambda: 0)
    opens = Opens(monkeypatch, nsys_run)
    assert main([*map(str, nsys_run), *(o.format(out=tmp_path) for o in options)]) == 0
    hashed = 1 if main is report.main else 0  # the report's sha256 of each file (summary.csv, results.db)
    for path in nsys_run:
        counts = opens.of(path.name)
        assert counts.get("open") == 1 + hashed, counts  # the sniff (and the hash)
        assert counts.get("sqlite3") == 1, counts
        assert 1 <= counts.get("connectorx", 0) <= NSYS_SELECTS, counts


def test_a_kineto_file_is_sniffed_once_and_read_once(tmp_path, monkeypatch, capsys):
    files = write_kineto_ddp_trace(tmp_path / "k", 400, 2, 3, 2)
    opens = Opens(monkeypatch, files)
    assert overlap.main([*map(str, files)]) == 0
    assert {f.name: opens.of(f.name) for f in files} == {f.name: {"open": 2} for f in files}


def test_the_counter_sees_an_open(tmp_path, monkeypatch):
    path = tmp_path / "x.sqlite"
    path.write_bytes(b"")
    opens = Opens(monkeypatch, [path])
    with open(path, "rb"):
        pass
    sqlite3.connect(path.resolve().as_uri() + "?mode=ro", uri=True).close()
    assert opens.of("x.sqlite") == {"open": 1, "sqlite3": 1}
