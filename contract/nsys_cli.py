"""The Nsight Systems command line as both sides use it: where nsys is installed, and turning a report into
a SQLite export that is either complete or absent (written under a temporary name, renamed once whole).

`profiling/` records and exports with it; `analysis/` exports the `.nsys-rep` files it is given (or says
the exact `nsys export` command to run). Standard library only, like the rest of `contract/`.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import sqlite3
import subprocess
from collections.abc import Mapping
from pathlib import Path

REPORT_SUFFIXES = (".nsys-rep", ".qdrep")

# Where nsys lives when it is not on PATH: CUDA toolkits, NVIDIA's standalone installers, Debian's
# nsight-systems-target package (which puts only a wrapper on PATH, and only when that package's
# /usr/bin link exists), and the nsys CLI that ships inside Nsight Compute (its importer sits apart:
# profiling/nsys_layout.py makes it record).
CANDIDATE_GLOBS = (
    "/usr/local/cuda/bin/nsys",
    "/usr/local/cuda-*/bin/nsys",
    "/opt/nvidia/nsight-systems/*/bin/nsys",
    "/opt/nvidia/nsight-systems-cli/*/bin/nsys",
    "/usr/lib/x86_64-linux-gnu/nsight-systems/target-linux-x64/nsys",
    "/usr/lib/nsight-systems/bin/nsys",
    "/opt/nvidia/nsight-compute/*/host/target-linux-x64/nsys",
)


class NsysError(RuntimeError):
    """nsys is missing, cannot run, or one of its steps failed; the message says what to do."""


def _is_executable(path: str | os.PathLike) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


def _version_key(path: str) -> tuple:
    """Sort key comparing the numbers in a path numerically: cuda-12.4 > cuda-9.2, 2026.2.1 > 2025.6."""
    return tuple((0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", path))


def find_nsys(env: Mapping[str, str] | None = None) -> Path | None:
    """$NSYS if set (and then only there), else PATH, else the usual install locations; None if absent.

    Raises NsysError when $NSYS names something that is not an executable file.
    """
    env = os.environ if env is None else env
    explicit = env.get("NSYS")
    if explicit:
        if not _is_executable(explicit):
            raise NsysError(f"NSYS={explicit} is not an executable file")
        return Path(explicit)
    on_path = shutil.which("nsys", path=env.get("PATH", os.defpath))
    if on_path:
        return Path(on_path)
    for pattern in CANDIDATE_GLOBS:
        for hit in sorted(glob.glob(pattern), key=_version_key, reverse=True):  # highest version first
            if _is_executable(hit):
                return Path(hit)
    return None


def partial_name(final: Path, suffix: str) -> Path:
    """A hidden sibling name for an output that is still being written (renamed when complete)."""
    return final.with_name(f".{final.name}.partial-{os.getpid()}{suffix}")


def is_complete_sqlite(path: Path) -> bool:
    """True when `path` opens as SQLite and holds the tables every nsys export has."""
    try:
        con = sqlite3.connect(Path(path).resolve().as_uri() + "?mode=ro", uri=True)
        try:
            names = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        finally:
            con.close()
    except sqlite3.DatabaseError:
        return False
    return "StringIds" in names


def export_sqlite(nsys: Path, report: Path, out: Path, timeout_s: float = 600) -> Path:
    """`nsys export --type sqlite` into a temporary name, renamed to `out` only once complete.

    An existing `out` is replaced; an interrupted or failed export leaves no file at `out`'s name.
    Raises NsysError when the report is missing, nsys cannot be run, or the export fails or times out.
    """
    if not report.is_file():
        raise NsysError(f"no report to export: {report}")
    tmp = partial_name(out, ".sqlite")
    cmd = sqlite_export_command(nsys, report, tmp)
    try:
        res = _run(nsys, cmd, timeout_s)
        if res.returncode != 0 or not tmp.is_file() or not is_complete_sqlite(tmp):
            detail = (res.stderr or res.stdout).strip().splitlines()
            raise NsysError(
                f"nsys export of {report} failed (exit {res.returncode})" + (f": {detail[-1]}" if detail else "")
            )
        os.replace(tmp, out)
    except subprocess.TimeoutExpired:
        raise NsysError(f"nsys export of {report} took longer than {timeout_s:.0f} s") from None
    finally:
        tmp.unlink(missing_ok=True)
    return out


def sqlite_export_command(nsys: Path, report: Path, out: Path) -> list[str]:
    """`nsys export` of `report` into the SQLite file `out` (export_sqlite gives it a temporary name)."""
    return [
        str(nsys),
        "export",
        "--type",
        "sqlite",
        "--quiet",
        "true",
        "--force-overwrite",
        "true",
        "--output",
        str(out),
        str(report),
    ]


def _run(nsys: Path, cmd: list[str], timeout_s: float) -> subprocess.CompletedProcess:
    """Run nsys; an OSError (not executable, exec format error, vanished) becomes an NsysError."""
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except OSError as e:
        raise NsysError(f"cannot run {nsys}: {e}") from None


def is_report(path: Path) -> bool:
    """True for an Nsight Systems report (`.nsys-rep`, or the older `.qdrep`)."""
    return path.name.endswith(REPORT_SUFFIXES)


def sqlite_path_for(report: Path) -> Path:
    """The export's conventional name: the report's, with `.sqlite` for its suffix."""
    name = report.name
    for suffix in REPORT_SUFFIXES:
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    return report.with_name(name + ".sqlite")


def export_command(report: Path, nsys: str = "nsys") -> list[str]:
    """The `nsys export` command a user can run to export `report` beside it."""
    return [nsys, "export", "--type", "sqlite", "-o", str(sqlite_path_for(report)), str(report)]
