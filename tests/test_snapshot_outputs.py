"""scripts/snapshot_outputs.py: what it masks, and what --compare reports (on hand-made snapshots)."""

from __future__ import annotations

import importlib.util
import json
import sqlite3
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "snapshot_outputs.py"


@pytest.fixture(scope="module")
def snap():
    spec = importlib.util.spec_from_file_location("snapshot_outputs", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_paths_and_timestamps_are_masked_and_nothing_else(snap, tmp_path):
    inputs, scratch = tmp_path / "in", tmp_path / "out"
    raw = f"{scratch}/r/index.html written 2026-11-26T12:39:20+00:00 from {inputs}/h100/x.sqlite: 12.5 ms".encode()
    assert (
        snap.normalise(raw, inputs, scratch)
        == b"<OUT>/r/index.html written <TIME> from <INPUTS>/h100/x.sqlite: 12.5 ms"
    )


def test_a_results_db_is_kept_as_its_dump_with_the_timestamp_masked(snap, tmp_path):
    db = tmp_path / "results.db"
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE traces (name TEXT, step_ms REAL, written TEXT)")
    con.execute("INSERT INTO traces VALUES ('a.sqlite', 13.5, '2026-11-26T12:22:17+00:00')")
    con.commit()
    con.close()
    snap.keep_file(db, tmp_path / "case.r.results.db", tmp_path, tmp_path / "scratch")
    dump = (tmp_path / "case.r.results.db.sql").read_text()
    assert "INSERT INTO \"traces\" VALUES('a.sqlite',13.5,'<TIME>');" in dump


def write(folder: Path, files: dict[str, str], rc: dict[str, int]) -> Path:
    folder.mkdir()
    for name, text in files.items():
        (folder / name).write_text(text)
    cases = {n: {"argv": [], "rc": c, "seconds": 0, "cpu_s": 0} for n, c in rc.items()}
    (folder / "manifest.json").write_text(json.dumps({"cases": cases, "inputs": {"a": "1"}}))
    return folder


def test_compare_names_the_cases_whose_files_or_exit_status_differ(snap, tmp_path, capsys):
    files = {"o.txt": "1\n", "o.txt.t.html": "<p>", "c.json": "{}", "e.txt": ""}
    old = write(tmp_path / "old", files, {"o.txt": 0, "c.json": 0, "e.txt": 2})
    new = write(tmp_path / "new", {**files, "o.txt.t.html": "<b>"}, {"o.txt": 0, "c.json": 0, "e.txt": 1})
    assert snap.compare(old, new) == 1
    out = capsys.readouterr().out
    assert "o.txt: o.txt.t.html differs" in out and "e.txt: exit 2 -> 1" in out and "c.json" not in out
    assert "2 of 3 cases differ" in out


def test_compare_of_equal_snapshots_is_0_and_a_quick_one_is_compared_on_its_cases(snap, tmp_path, capsys):
    old = write(tmp_path / "old", {"o.txt": "1\n", "c.json": "{}"}, {"o.txt": 0, "c.json": 0})
    new = write(tmp_path / "new", {"o.txt": "1\n"}, {"o.txt": 0})
    assert snap.compare(old, new) == 0
    assert "0 of 1 cases differ" in capsys.readouterr().out


def test_case_names_are_unique_and_every_cli_has_cases(snap):
    names = [name for name, _, _ in snap.cases()]
    assert len(names) == len(set(names))
    assert {n.split(".")[0] for n in names} == {"overlap", "collectives", "timeline", "report", "advise"}
    assert all(n.rsplit(".", 1)[1] in ("txt", "csv", "json") for n in names)
