"""A run's first file read ahead: `start_read(path) -> StartedRead`, called by the commands before they import
the analysis, handed down to the reader by argument (OpenRuns -> load_run -> load_trace -> read_trace).

A first look at a large export spends some 0.4 s importing pandas and the analysis before it reads a row,
while the machine's other core idles. Started first, an nsys export's large tables' first chunks read on
threads meanwhile (connectorx releases the GIL the imports hold); the reader takes the open export and
its chunks, so the file is still sniffed once and connected once. Light on purpose: no pandas here. On
two cores it takes 8-12% off the wall time of `python -m analysis.overlap` on the 1M-kernel x 8-rank
export (three sets of 5-7 runs with and without it, in turns) and 6% on the 10M one, at the same CPU
time and no more memory (docs/measurements/2026-11-28-read-ahead.md).
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from pathlib import Path

from analysis.errors import TraceError
from analysis.trace.readers.nsys_db import NsysExport
from analysis.trace.readers.sniff import Sniffed, sniff
from analysis.trace.readers.sqlite_read import SQLITE_MAGIC


@dataclass
class StartedRead:
    """A file's read begun before anyone asked for it (start_read): its sniff and, for a plain nsys export,
    the export opened with its large tables' first chunks reading on threads (NsysExport.start_reading).
    read_trace takes both when given it; close() ends what was not taken (closing twice is harmless)."""

    sniffed: Sniffed
    export: NsysExport | None = None

    def close(self) -> None:
        if self.export is not None:
            self.export.close()


def start_read(path: str | Path) -> StartedRead:
    """Sniff `path` and, when it is a plain (uncompressed) nsys export, open it and start reading its large
    tables (the module docstring says why). A file that cannot be opened so is left to the reader, which
    says what is wrong."""
    found = sniff(path)
    if found.head is None or not found.head.startswith(SQLITE_MAGIC):  # JSON, compressed or unreadable
        return StartedRead(found)
    try:
        export = NsysExport(found.path, found.head)
    except (TraceError, OSError, sqlite3.Error):
        return StartedRead(found)
    try:
        export.start_reading()
    except (OSError, sqlite3.Error):
        export.close()
        return StartedRead(found)
    return StartedRead(found, export)
