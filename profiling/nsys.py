"""Find the Nsight Systems CLI and turn its reports into SQLite files that are either complete or absent,
with profiling's install steps (the mechanics are shared with the analysis: contract/nsys_cli.py).
An nsys whose importer is not where it looks (Debian's packages, the nsys inside Nsight Compute) runs
from a private folder that puts it there (profiling/nsys_layout.py).

    python -m profiling.nsys find                 # prints the nsys path, or the install steps (exit 2)
    python -m profiling.nsys export REP.nsys-rep OUT.sqlite
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from contract import nsys_cli
from contract.nsys_cli import NsysError, export_sqlite
from profiling import nsys_layout

__all__ = ["INSTALL_STEPS", "NsysError", "export_sqlite", "find_nsys", "nsys_version"]

INSTALL_STEPS = """\
Nsight Systems (nsys) was not found on PATH, in the usual CUDA and Nsight locations, or in $NSYS.
Install it, then re-run:
  - on Debian 12 as root:  bash scripts/install_nsys.sh
    (enables Debian's contrib+non-free components, runs
     apt-get install --no-install-recommends nsight-systems-target nsight-systems, and links
     /usr/lib/nsight-systems/host-linux-x64 into /usr/lib/x86_64-linux-gnu/nsight-systems/)
  - elsewhere: download Nsight Systems from https://developer.nvidia.com/nsight-systems,
    then put its bin/ on PATH or set NSYS=/path/to/nsys
The benchmark itself runs without nsys:  python -m profiling.run --help"""


def find_nsys(env: Mapping[str, str] | None = None) -> Path:
    """Locate nsys ($NSYS if set, and then only there; else PATH; else the usual install locations),
    as a path that records reports: a private copy beside its importer when the install lacks the link."""
    found = nsys_cli.find_nsys(env)
    if found is None:
        raise NsysError(INSTALL_STEPS)
    try:
        return nsys_layout.runnable_nsys(found)
    except OSError as err:
        raise NsysError(
            f"{found} needs its importer beside it, and a private copy could not be made "
            f"in {nsys_layout.farm_root()}: {err}"
        ) from None


def nsys_version(nsys: Path) -> str:
    """The version string nsys reports, e.g. '2022.4.2.1-df9881f'; 'unknown' when it does not run."""
    try:
        out = subprocess.run([str(nsys), "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):  # not there (a --dry-run without nsys), or hung
        return "unknown"
    return out.stdout.strip().split()[-1] if out.returncode == 0 and out.stdout.strip() else "unknown"


def _main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m profiling.nsys", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
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
