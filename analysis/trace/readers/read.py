"""Reading a trace in either format: `read_trace(paths) -> Trace`, and a run's first file read ahead
(`start_read(path) -> StartedRead`).

The format is recognised from the content (sniff.py: torch.profiler JSON, gzipped or not, else an nsys
SQLite export), the file(s) go to their reader (nsys.py, kineto.py), and several files are merged as the
one-rank files of one run, each on its own clock. The frames come back as read: whether the files
are one run's, their common clock and which GPU work is communication (gpu_ops.is_comm) are decided
after reading, by `analysis.run.loaded_run.load_trace`, the entry every CLI and the Python API use.

The read ahead: a first look at a large export spends some 0.4 s importing pandas and the analysis
before it reads a row, while the machine's other core idles. `start_read` is called by the commands
before they import the analysis and handed down to the reader by argument (OpenRuns -> load_run ->
load_trace -> read_trace). Started first, an nsys export's large tables' first chunks read on threads
meanwhile (connectorx releases the GIL the imports hold); the reader takes the open export and its
chunks, so the file is still sniffed once and connected once. Light on purpose: no pandas at import
(the readers and the frames are imported when a trace is read). On two cores it takes 8-12% off the
wall time of `python -m analysis.overlap` on the 1M-kernel x 8-rank export (three sets of 5-7 runs with
and without it, in turns) and 6% on the 10M one, at the same CPU time and no more memory
(docs/measurements/2026-11-28-read-ahead.md).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from analysis.errors import TraceError
from analysis.trace.patterns import Patterns
from analysis.trace.readers.nsys_db import NsysExport
from analysis.trace.readers.sniff import SQLITE_MAGIC, Sniffed, sniff

if TYPE_CHECKING:
    from analysis.trace.frames import Trace


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


def read_trace(
    paths: str | Path | Iterable[str | Path], patterns: Patterns | None = None, *, started: StartedRead | None = None
) -> Trace:
    """Read one file, or several one-rank files of the same job merged onto the first file's clock
    (`patterns` name the steps and backward ranges a torch.profiler trace's backward pass is built in;
    `started`: the first file's read, started already (start_read))."""
    files = [Path(paths)] if isinstance(paths, (str, Path)) else [Path(p) for p in paths]
    if not files:
        raise TraceError("no trace path given")
    patterns = patterns or Patterns()
    sniffed = sniffed_alike(files, started)  # each file opened once (here, or by start_read); the reader once more
    if sniffed[0].kineto:  # torch.profiler JSON: its own reader, the same frames
        from analysis.trace.readers.kineto import load_kineto

        trace = load_kineto(files, patterns)
    else:
        from analysis.trace.readers.nsys import load_nsys

        export = started.export if started is not None else None
        trace = load_nsys(files, patterns, heads=[s.head for s in sniffed], started=export)
    return trace


def sniffed_alike(files: list[Path], started: StartedRead | None = None) -> list[Sniffed]:
    """Each file's format (sniff.py), all the same: a mix of torch.profiler JSON and nsys exports is a TraceError.
    The `started` file was sniffed when its read started: that sniff is taken."""
    known = {started.sniffed.path: started.sniffed} if started is not None else {}
    sniffed = [known.get(p) or sniff(p) for p in files]
    kineto = [s.kineto for s in sniffed]
    if any(kineto) and not all(kineto):
        raise TraceError(f"{', '.join(map(str, files))}: cannot merge torch.profiler JSON with nsys exports")
    return sniffed


def one_format(files: list[Path]) -> bool:
    """Whether the files are torch.profiler JSON (else nsys exports); a mix of both is a TraceError."""
    return sniffed_alike(files)[0].kineto
