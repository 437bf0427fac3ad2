"""Find the Nsight Systems CLI and turn its reports into SQLite files that are either complete or absent.

    python -m profiling.nsys find                 # prints the nsys path, or the install steps (exit 2)
    python -m profiling.nsys export REP.nsys-rep OUT.sqlite
"""
from __future__ import annotations

import argparse
import glob
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Mapping, Sequence

# Where nsys lives when it is not on PATH: CUDA toolkits, NVIDIA's standalone installers, Debian's
# nsight-systems-target package (which puts only a wrapper on PATH, and only when that package's
# /usr/bin link exists).
CANDIDATE_GLOBS = (
    "/usr/local/cuda/bin/nsys",
    "/usr/local/cuda-*/bin/nsys",
    "/opt/nvidia/nsight-systems/*/bin/nsys",
    "/opt/nvidia/nsight-systems-cli/*/bin/nsys",
    "/usr/lib/x86_64-linux-gnu/nsight-systems/target-linux-x64/nsys",
    "/usr/lib/nsight-systems/bin/nsys",
)

INSTALL_STEPS = """\
Nsight Systems (nsys) was not found on PATH, in the usual CUDA locations, or in $NSYS.
Install it, then re-run:
  - on Debian 12 as root:  bash scripts/install_nsys.sh
    (enables Debian's contrib+non-free components, runs
     apt-get install --no-install-recommends nsight-systems-target nsight-systems, and links
     /usr/lib/nsight-systems/host-linux-x64 into /usr/lib/x86_64-linux-gnu/nsight-systems/)
  - elsewhere: download Nsight Systems from https://developer.nvidia.com/nsight-systems,
    then put its bin/ on PATH or set NSYS=/path/to/nsys
The benchmark itself runs without nsys:  python -m profiling.run --help"""


class NsysError(RuntimeError):
    """nsys is missing, or one of its steps failed; the message says what to do."""


def _is_executable(path: str | os.PathLike) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


def find_nsys(env: Mapping[str, str] | None = None) -> Path:
    """Locate nsys: $NSYS if set (and then only there), else PATH, else the usual install locations."""
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
        for hit in sorted(glob.glob(pattern), reverse=True):  # newest versioned folder first
            if _is_executable(hit):
                return Path(hit)
    raise NsysError(INSTALL_STEPS)


def nsys_version(nsys: Path) -> str:
    """The version string nsys reports, e.g. '2022.4.2.1-df9881f'."""
    out = subprocess.run([str(nsys), "--version"], capture_output=True, text=True, timeout=60)
    return out.stdout.strip().split()[-1] if out.returncode == 0 and out.stdout.strip() else "unknown"


def partial_name(final: Path, suffix: str) -> Path:
    """A hidden sibling name for an output that is still being written (renamed when complete)."""
    return final.with_name(f".{final.name}.partial-{os.getpid()}{suffix}")


def is_complete_sqlite(path: Path) -> bool:
    """True when `path` opens as SQLite and holds the tables every nsys export has."""
    try:
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
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
    """
    if not report.is_file():
        raise NsysError(f"no report to export: {report}")
    tmp = partial_name(out, ".sqlite")
    cmd = [str(nsys), "export", "--type", "sqlite", "--quiet", "true", "--force-overwrite", "true",
           "--output", str(tmp), str(report)]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        if res.returncode != 0 or not tmp.is_file() or not is_complete_sqlite(tmp):
            detail = (res.stderr or res.stdout).strip().splitlines()
            raise NsysError(f"nsys export of {report} failed (exit {res.returncode})"
                            + (f": {detail[-1]}" if detail else ""))
        os.replace(tmp, out)
    except subprocess.TimeoutExpired:
        raise NsysError(f"nsys export of {report} took longer than {timeout_s:.0f} s") from None
    finally:
        tmp.unlink(missing_ok=True)
    return out


def _main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m profiling.nsys", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("find", help="print the path of nsys and its version; exit 2 with install steps if missing")
    exp = sub.add_parser("export", help="export a .nsys-rep to SQLite via a temporary name (replaces OUT)")
    exp.add_argument("report", type=Path)
    exp.add_argument("out", type=Path)
    args = parser.parse_args(argv)
    try:
        nsys = find_nsys()
        if args.cmd == "find":
            print(f"{nsys}\t{nsys_version(nsys)}")
        else:
            export_sqlite(nsys, args.report, args.out)
            print(args.out)
    except NsysError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(_main())
