"""contract.nsys_cli: version order of install folders, read-only probe, nsys that cannot run."""

import os

import pytest

from contract import nsys_cli
from contract.nsys_cli import NsysError
from tests.support.synthetic import NsysWriter


def _fake_nsys(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(0o755)
    return path


def test_find_nsys_prefers_the_highest_version_numerically(tmp_path, monkeypatch):
    for version in ("9.2", "12.4", "12.10"):
        _fake_nsys(tmp_path / f"cuda-{version}" / "bin" / "nsys")
    monkeypatch.setattr(nsys_cli, "CANDIDATE_GLOBS", (str(tmp_path / "cuda-*" / "bin" / "nsys"),))
    found = nsys_cli.find_nsys({"PATH": str(tmp_path / "empty")})
    assert found == tmp_path / "cuda-12.10" / "bin" / "nsys"


@pytest.mark.parametrize("name", ["a#b.sqlite", "a?b.sqlite", "a%20b.sqlite"])
def test_is_complete_sqlite_with_uri_characters_in_the_path(tmp_path, name):
    w = NsysWriter(tmp_path / name)
    w.nvtx(1, 1, 0, 10, "step 0")
    path = w.close()
    assert nsys_cli.is_complete_sqlite(path)
    assert not (tmp_path / "a").exists()  # no file opened at the truncated name
    (tmp_path / "plain.sqlite").write_bytes(b"not sqlite")
    assert not nsys_cli.is_complete_sqlite(tmp_path / "plain.sqlite")


def test_export_with_an_nsys_that_cannot_run_is_one_error(tmp_path):
    nsys = tmp_path / "nsys"
    nsys.write_bytes(b"\x00\x01\x02 not a program")
    nsys.chmod(0o755)
    report = tmp_path / "r.nsys-rep"
    report.write_bytes(b"report")
    with pytest.raises(NsysError, match=r"^cannot run .*nsys: .*Exec format error"):
        nsys_cli.export_sqlite(nsys, report, tmp_path / "r.sqlite")
    assert sorted(os.listdir(tmp_path)) == ["nsys", "r.nsys-rep"]  # no export, no partial file left
