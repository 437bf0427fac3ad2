"""nsys installs whose importer is not at ../host-linux-x64 (Nsight Compute's, Debian's), and a capture
whose import failed: found, made to record, imported or kept with the command (stand-in nsys, and the
real Debian nsys where installed)."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from contract import nsys_cli
from contract.nsys_cli import is_complete_sqlite
from profiling import nsys_layout
from profiling.nsys import NsysError, find_nsys
from profiling.session import NsysOptions, record
from tests.profiling.test_nsys import FAKE, fake_nsys, make_exe

OK = [sys.executable, "-c", "print('training output')"]
# A stand-in nsys that, like the real one, looks for its importer at ../host-linux-x64 of its real path.
LAYOUT_AWARE = f'#!/bin/sh\nFAKE_NSYS_SELF="$(readlink -f "$0")" exec {sys.executable} {FAKE} "$@"\n'
IMPORTER = f'#!/bin/sh\nexec {sys.executable} {FAKE} "$@"\n'


def nsight_compute(root: Path, version: str = "2025.3.1") -> tuple[Path, Path]:
    """The layout of Nsight Compute's nsys: host/target-linux-x64/nsys, importer in host/linux-desktop-glibc_*."""
    host = root / "opt" / "nvidia" / "nsight-compute" / version / "host"
    nsys = make_exe(host / "target-linux-x64" / "nsys", LAYOUT_AWARE)
    (host / "target-linux-x64" / "libToolsInjection64.so").write_text("a library")
    (host / "target-linux-x64" / "rules").mkdir()
    importer = make_exe(host / "linux-desktop-glibc_2_11_3-x64" / "QdstrmImporter", IMPORTER)
    return nsys, importer


@pytest.fixture
def farm(tmp_path, monkeypatch):
    root = tmp_path / "farm"
    monkeypatch.setattr(nsys_layout, "farm_root", lambda: root)
    return root


def test_nsight_compute_nsys_is_found_and_runs_from_a_private_folder(tmp_path, farm, monkeypatch, capfd):
    nsys, importer = nsight_compute(tmp_path)
    monkeypatch.setattr(
        nsys_cli, "CANDIDATE_GLOBS", (str(tmp_path / "opt/nvidia/nsight-compute/*/host/target-linux-x64/nsys"),)
    )
    cli = find_nsys({"PATH": "/nonexistent"})
    assert cli.parent.parent.parent == farm and cli.name == "nsys"
    assert cli.is_file() and not cli.is_symlink()  # a copy: nsys finds `..` from its real path
    assert (cli.parent / "libToolsInjection64.so").resolve() == nsys.parent / "libToolsInjection64.so"
    assert (cli.parent / "rules").is_symlink()
    assert (cli.parent.parent / "host-linux-x64").resolve() == importer.parent
    assert "private copy" in capfd.readouterr().err
    # NSYS= the same install gives the same folder, built once.
    assert find_nsys({"NSYS": str(nsys), "PATH": ""}) == cli
    assert "private copy" not in capfd.readouterr().err
    # The original writes only a .qdstrm; the private copy records the report itself.
    out = tmp_path / "traces"
    out.mkdir()
    done = record(cli, NsysOptions(), OK, out / "overlap")
    assert done.report.read_text() == "fake report" and is_complete_sqlite(done.sqlite)
    assert "mporter" not in capfd.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["overlap.nsys-rep", "overlap.sqlite"]


def test_an_install_with_its_importer_beside_it_is_used_as_it_is(tmp_path, farm):
    nsys = make_exe(tmp_path / "nsight-systems" / "target-linux-x64" / "nsys", LAYOUT_AWARE)
    make_exe(tmp_path / "nsight-systems" / "host-linux-x64" / "QdstrmImporter", IMPORTER)
    assert find_nsys({"NSYS": str(nsys), "PATH": ""}) == nsys
    assert not farm.exists()


def test_the_newest_importer_folder_and_debians_importer_are_found(tmp_path):
    nsys, _ = nsight_compute(tmp_path)
    newer = make_exe(nsys.parent.parent / "linux-desktop-glibc_2_17-x64" / "QdstrmImporter", IMPORTER)
    assert nsys_layout.find_importer(nsys) == newer
    deb_cli = make_exe(tmp_path / "usr/lib/x86_64-linux-gnu/nsight-systems/target-linux-x64/nsys")
    deb_host = make_exe(tmp_path / "usr/lib/nsight-systems/host-linux-x64/QdstrmImporter").parent
    dirs = dict(debian_cli_dir=deb_cli.parent, debian_importer_dir=deb_host)
    assert nsys_layout.find_importer(deb_cli, **dirs) == deb_host / "QdstrmImporter"
    other = make_exe(tmp_path / "elsewhere" / "target-linux-x64" / "nsys")
    on_path = shutil.which("QdstrmImporter")
    assert nsys_layout.find_importer(other, **dirs) == (Path(on_path) if on_path else None)


def test_ldd_output_names_the_missing_libraries():
    out = (
        "\tlinux-vdso.so.1 (0x00007ffd)\n\tlibdw.so.1 => not found\n"
        "\tlibstdc++.so.6 => /lib/x86_64-linux-gnu/libstdc++.so.6 (0x7f)\n\tlibpfm.so.4 => not found\n"
    )
    assert nsys_layout.parse_ldd_missing(out) == ["libdw.so.1", "libpfm.so.4"]


# ---- a capture nsys could not import --------------------------------------------------------------


def previous_outputs(tmp_path: Path) -> Path:
    out = tmp_path / "traces"
    out.mkdir()
    (out / "overlap.nsys-rep").write_text("previous report")
    (out / "overlap.sqlite").write_text("previous export")
    return out


def test_failed_import_without_importer_keeps_the_capture_and_gives_the_command(tmp_path, monkeypatch):
    if shutil.which("QdstrmImporter"):
        pytest.skip("a QdstrmImporter on PATH would be found")
    monkeypatch.setenv("FAKE_NSYS_IMPORT_FAIL", "1")
    nsys = fake_nsys(tmp_path)  # tmp/bin/nsys: no importer anywhere near it
    out = previous_outputs(tmp_path)
    with pytest.raises(NsysError) as err:
        record(nsys, NsysOptions(), OK, out / "overlap")
    msg = str(err.value)
    assert "importer failed (Importer error status: An unknown error occurred.)" in msg
    assert "never opened" not in msg
    assert f"the capture is kept in {out / 'overlap.qdstrm'}" in msg
    assert f"Import it with: QdstrmImporter -i {out / 'overlap.qdstrm'}" in msg
    assert f"python -m profiling.nsys export {out / 'overlap.nsys-rep'} {out / 'overlap.sqlite'}" in msg
    assert (out / "overlap.qdstrm").read_text() == "fake capture"
    assert (out / "overlap.nsys-rep").read_text() == "previous report"
    assert (out / "overlap.sqlite").read_text() == "previous export"
    assert sorted(p.name for p in out.iterdir()) == ["overlap.nsys-rep", "overlap.qdstrm", "overlap.sqlite"]


def test_failed_import_is_done_here_when_the_importer_is_found(tmp_path, monkeypatch, capfd):
    monkeypatch.setenv("FAKE_NSYS_IMPORT_FAIL", "1")
    nsys = fake_nsys(tmp_path)
    importer = make_exe(tmp_path / "host-linux-x64" / "QdstrmImporter", IMPORTER)  # ../host-linux-x64 of bin/
    out = previous_outputs(tmp_path)
    done = record(nsys, NsysOptions(), OK, out / "overlap")
    assert done.report.read_text() == "fake report" and is_complete_sqlite(done.sqlite)
    err = capfd.readouterr().err
    assert f"did not import it (Importer error status: An unknown error occurred.); importing with {importer}" in err
    assert sorted(p.name for p in out.iterdir()) == ["overlap.nsys-rep", "overlap.sqlite"]


def test_importer_that_fails_too_is_reported_with_its_message_and_path(tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_NSYS_IMPORT_FAIL", "1")
    monkeypatch.setenv("FAKE_IMPORTER_FAIL", "1")
    nsys = fake_nsys(tmp_path)
    importer = make_exe(tmp_path / "host-linux-x64" / "QdstrmImporter", IMPORTER)
    out = previous_outputs(tmp_path)
    with pytest.raises(NsysError) as err:
        record(nsys, NsysOptions(), OK, out / "overlap")
    msg = str(err.value)
    assert (
        "Running QdstrmImporter here failed too (exit 127: QdstrmImporter: error while loading shared "
        "libraries: libdw.so.1" in msg
    )
    assert f"Import it with: {importer} -i {out / 'overlap.qdstrm'}" in msg
    assert (out / "overlap.qdstrm").read_text() == "fake capture"
    assert (out / "overlap.nsys-rep").read_text() == "previous report"


@pytest.mark.subprocess  # runs run_nsys.sh (stand-in nsys, the program not run)
def test_cli_says_the_import_failed_in_one_line(tmp_path):
    """run_nsys.sh with nsys importing nothing: one error line naming the cause, exit 1, .qdstrm kept."""
    import subprocess

    from tests.profiling.test_nsys import REPO

    if shutil.which("QdstrmImporter"):
        pytest.skip("a QdstrmImporter on PATH would be found")
    nsys = fake_nsys(tmp_path)
    env = {**os.environ, "NSYS": str(nsys), "FAKE_NSYS_IMPORT_FAIL": "1", "FAKE_NSYS_SKIP_PROGRAM": "1"}
    res = subprocess.run(
        [
            "bash",
            "run_nsys.sh",
            "naive",
            "-o",
            str(tmp_path / "t"),
            "--steps",
            "1",
            "--warmup",
            "0",
            "--batch-size",
            "2",
            "--context-length",
            "8",
            "--model",
            "tiny",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=300,
    )
    assert res.returncode == 1, res.stderr
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "importer failed" in errors[0] and "QdstrmImporter -i" in errors[0]
    assert "Traceback" not in res.stderr
    assert (tmp_path / "t" / "naive.qdstrm").is_file()


# ---- the real nsys (Debian's package), where installed ---------------------------------------------

DEB_CLI, DEB_HOST = nsys_layout.DEBIAN_CLI_DIR, nsys_layout.DEBIAN_IMPORTER_DIR
needs_debian_nsys = pytest.mark.skipif(
    not (DEB_CLI / "nsys").is_file() or not (DEB_HOST / "QdstrmImporter").is_file(),
    reason="Debian's nsight-systems packages are not installed",
)


@pytest.mark.nsys  # records with the real nsys
@needs_debian_nsys
def test_real_nsys_without_its_importer_link_records_from_the_private_folder(tmp_path, farm, monkeypatch, capfd):
    """A copy of Debian's CLI folder with no host-linux-x64 beside it: nsys alone writes only a .qdstrm
    (and says why); the private folder records a report; record() imports a stray .qdstrm itself."""
    install = tmp_path / "install"
    install.mkdir()
    nsys_layout._link_farm(DEB_CLI, install / "target-linux-x64")
    nsys = install / "target-linux-x64" / "nsys"
    dirs = dict(debian_cli_dir=install / "target-linux-x64", debian_importer_dir=DEB_HOST)
    cli = nsys_layout.runnable_nsys(nsys, **dirs)
    assert cli != nsys and (cli.parent.parent / "host-linux-x64").resolve() == DEB_HOST.resolve()
    out = tmp_path / "traces"
    out.mkdir()
    done = record(
        cli, NsysOptions(), [sys.executable, "-c", "import nvtx\nwith nvtx.annotate('profile'): pass"], out / "private"
    )
    assert done.report.stat().st_size > 0 and is_complete_sqlite(done.sqlite)
    # The install as it is: nsys says the importer was not found; the importer on PATH imports it here.
    monkeypatch.setenv("PATH", f"{DEB_HOST}:{os.environ['PATH']}")
    capfd.readouterr()
    done = record(
        nsys,
        NsysOptions(),
        [sys.executable, "-c", "import nvtx\nwith nvtx.annotate('profile'): pass"],
        out / "as_installed",
    )
    err = capfd.readouterr().err
    assert "Importer error status: The importer binary and its dependencies were not found" in err
    assert "importing with" in err
    assert done.report.stat().st_size > 0 and is_complete_sqlite(done.sqlite)
    assert sorted(p.name for p in out.iterdir()) == [
        "as_installed.nsys-rep",
        "as_installed.sqlite",
        "private.nsys-rep",
        "private.sqlite",
    ]
