"""Nsight Systems reports given to the analysis: what to tell a user who passed a `.nsys-rep` instead of
its SQLite export, and exporting it beside the report when asked (`--export`). The nsys mechanics
(finding nsys, the complete-or-absent export) are contract/nsys_cli.py, shared with `profiling/`.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from analysis.errors import TraceError
from contract.nsys_cli import NsysError, export_command, export_sqlite, find_nsys, is_report, sqlite_path_for

__all__ = ["export_report", "is_report", "report_error"]


def report_error(report: Path, export_option: bool = True) -> TraceError:
    """What to tell a user who passed a report instead of its SQLite export (the exact export command;
    with export_option, also that --export would run it)."""
    command = shlex.join(export_command(report))
    hint = "  (or pass --export to run it)" if export_option else ""
    return TraceError(f"{report}: this is an Nsight Systems report, not its SQLite export; run: {command}{hint}")


def export_report(report: Path, timeout_s: float = 600) -> Path:
    """Export a report beside it (never overwriting an existing .sqlite) and return the export's path."""
    if not report.is_file():
        raise TraceError(f"{report}: no such file")
    target = sqlite_path_for(report)
    if target.exists():
        raise TraceError(f"{target} already exists; analyse it directly (not overwriting it)")
    try:
        nsys = find_nsys()
        if nsys is None:
            raise TraceError(
                f"{report}: nsys not found (PATH, $NSYS, /usr/local/cuda/bin, /opt/nvidia/nsight-systems); "
                f"run elsewhere: {shlex.join(export_command(report))}"
            )
        return export_sqlite(nsys, report, target, timeout_s)
    except NsysError as err:
        raise TraceError(f"{report}: {err}") from None
