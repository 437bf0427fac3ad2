"""`.nsys-rep` reports: the exact `nsys export` command, and running it when asked and nsys is present."""
from __future__ import annotations

import glob
import os
import shlex
import shutil
import subprocess
from pathlib import Path

from analysis.errors import TraceError

REPORT_SUFFIXES = (".nsys-rep", ".qdrep")


def is_report(path: Path) -> bool:
    return path.name.endswith(REPORT_SUFFIXES)


def sqlite_path_for(report: Path) -> Path:
    name = report.name
    for suffix in REPORT_SUFFIXES:
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    return report.with_name(name + ".sqlite")


def export_command(report: Path, nsys: str = "nsys") -> list[str]:
    return [nsys, "export", "--type", "sqlite", "-o", str(sqlite_path_for(report)), str(report)]


def find_nsys() -> str | None:
    """nsys from $NSYS, PATH, /usr/local/cuda/bin or /opt/nvidia/nsight-systems/*/bin."""
    candidates = [os.environ.get("NSYS", ""), shutil.which("nsys") or "", "/usr/local/cuda/bin/nsys",
                  *sorted(glob.glob("/opt/nvidia/nsight-systems/*/bin/nsys"), reverse=True)]
    return next((c for c in candidates if c and os.access(c, os.X_OK) and not os.path.isdir(c)), None)


def report_error(report: Path) -> TraceError:
    """What to tell a user who passed a report instead of its SQLite export."""
    command = shlex.join(export_command(report))
    return TraceError(f"{report}: this is an Nsight Systems report, not its SQLite export; run: {command}"
                      f"  (or pass --export to run it)")


def export_report(report: Path, timeout_s: float = 600) -> Path:
    """Run `nsys export` for a report (never overwriting an existing .sqlite) and return the export's path."""
    if not report.is_file():
        raise TraceError(f"{report}: no such file")
    target = sqlite_path_for(report)
    if target.exists():
        raise TraceError(f"{target} already exists; analyse it directly (not overwriting it)")
    nsys = find_nsys()
    if nsys is None:
        raise TraceError(f"{report}: nsys not found (PATH, $NSYS, /usr/local/cuda/bin, /opt/nvidia/nsight-systems); "
                         f"run elsewhere: {shlex.join(export_command(report))}")
    try:
        done = subprocess.run(export_command(report, nsys), capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise TraceError(f"{report}: nsys export did not finish in {timeout_s:.0f} s") from None
    if done.returncode != 0 or not target.exists():
        last = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise TraceError(f"{report}: nsys export failed (exit {done.returncode}): {last[0]}")
    return target
