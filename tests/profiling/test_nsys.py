"""nsys discovery and the SQLite export's temp-name-then-rename contract (with a stand-in nsys)."""

from __future__ import annotations

import os
import sqlite3
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from contract import nsys_cli as nsys_mod  # where the install locations are looked up
from contract.nsys_cli import is_complete_sqlite
from profiling.nsys import NsysError, export_sqlite, find_nsys

FAKE = Path(__file__).with_name("fake_nsys.py")
REPO = Path(__file__).resolve().parents[2]


def make_exe(path: Path, body: str = "#!/bin/sh\necho fake\n") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def fake_nsys(tmp_path: Path) -> Path:
    return make_exe(tmp_path / "bin" / "nsys", f'#!/bin/sh\nexec {sys.executable} {FAKE} "$@"\n')


def test_explicit_nsys_wins_over_path(tmp_path):
    chosen = make_exe(tmp_path / "a" / "mynsys")
    on_path = make_exe(tmp_path / "b" / "nsys")
    assert find_nsys({"NSYS": str(chosen), "PATH": str(on_path.parent)}) == chosen


def test_explicit_nsys_that_is_not_executable_is_an_error(tmp_path):
    (tmp_path / "nsys").write_text("not executable")
    with pytest.raises(NsysError, match="not an executable"):
        find_nsys({"NSYS": str(tmp_path / "nsys"), "PATH": ""})


def test_path_then_usual_locations(tmp_path, monkeypatch):
    on_path = make_exe(tmp_path / "path" / "nsys")
    assert find_nsys({"PATH": f"/nonexistent:{on_path.parent}"}) == on_path
    old = make_exe(tmp_path / "opt" / "2023.1" / "bin" / "nsys")
    new = make_exe(tmp_path / "opt" / "2024.5" / "bin" / "nsys")
    monkeypatch.setattr(
        nsys_mod, "CANDIDATE_GLOBS", (str(tmp_path / "cuda" / "nsys"), str(tmp_path / "opt" / "*" / "bin" / "nsys"))
    )
    assert find_nsys({"PATH": "/nonexistent"}) == new != old


def test_missing_nsys_gives_install_steps(monkeypatch):
    monkeypatch.setattr(nsys_mod, "CANDIDATE_GLOBS", ())
    with pytest.raises(NsysError) as err:
        find_nsys({"PATH": "/nonexistent"})
    text = str(err.value)
    assert "bash scripts/install_nsys.sh" in text and "nsight-systems-target" in text and "NSYS=" in text


def test_cli_reports_missing_nsys_in_one_line_and_exit_2():
    env = {**os.environ, "NSYS": "/nonexistent/nsys"}
    res = subprocess.run(
        [sys.executable, "-m", "profiling.nsys", "find"], capture_output=True, text=True, env=env, cwd=REPO, timeout=60
    )
    assert res.returncode == 2
    assert res.stderr.strip() == "error: NSYS=/nonexistent/nsys is not an executable file"
    assert "Traceback" not in res.stderr


def test_export_replaces_output_only_when_complete(tmp_path):
    nsys = fake_nsys(tmp_path)
    report = tmp_path / "run.nsys-rep"
    report.write_text("report")
    out = tmp_path / "run.sqlite"
    out.write_text("the previous export")
    bystander = tmp_path / "other.sqlite"
    bystander.write_text("someone else's")
    export_sqlite(nsys, report, out)
    assert is_complete_sqlite(out)
    assert bystander.read_text() == "someone else's"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bin", "other.sqlite", "run.nsys-rep", "run.sqlite"]


def test_failed_export_leaves_previous_output_and_no_partial_file(tmp_path, monkeypatch):
    nsys = fake_nsys(tmp_path)
    report = tmp_path / "run.nsys-rep"
    report.write_text("report")
    out = tmp_path / "run.sqlite"
    out.write_text("the previous export")
    monkeypatch.setenv("FAKE_NSYS_EXPORT_FAIL", "1")
    with pytest.raises(NsysError, match=r"export of .* failed \(exit 1\): export failed: disk full"):
        export_sqlite(nsys, report, out)
    assert out.read_text() == "the previous export"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bin", "run.nsys-rep", "run.sqlite"]


def test_is_complete_sqlite_rejects_truncated_and_foreign_files(tmp_path):
    truncated = tmp_path / "t.sqlite"
    truncated.write_bytes(b"SQLite format 3\0" + b"\0" * 20)
    foreign = tmp_path / "f.sqlite"
    con = sqlite3.connect(foreign)
    con.execute("CREATE TABLE x (a)")
    con.commit()
    con.close()
    assert not is_complete_sqlite(truncated)
    assert not is_complete_sqlite(foreign)
    assert not is_complete_sqlite(tmp_path / "absent.sqlite")
