"""Start reading a run's first file while the analysis code is still being imported: `start`, then the
loader takes what was started (`sniffed`, `opened`, kineto_json.read_kineto); `discard` closes what it
never took.

A first look at a large export spends about 0.4 s importing pandas and the analysis before it reads a
row, while the machine's other core idles. The CLIs call `start` right after grouping their inputs,
when the first run is loaded in this process and not from the cache: its first file is sniffed and
opened as the loader would, and the first chunks of its GPU and runtime tables start reading on
background threads (sqlite_chunks.start_chunks; connectorx releases the GIL the imports hold). The
loader takes the sniff and the open export from here, so the file is still sniffed once and connected
once, and its table reads pick up the chunks already read. A large torch.profiler file's event pieces
start decoding in forked workers (kineto_json.start_read: the decode needs numpy and msgspec, not
pandas), and read_kineto takes their columns.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from analysis.errors import TraceError
from analysis.trace.readers import kineto_json
from analysis.trace.readers.nsys_db import NsysExport
from analysis.trace.readers.sniff import Sniffed, sniff
from analysis.trace.readers.sqlite_chunks import start_chunks

_SNIFFED: dict[Path, Sniffed] = {}
_OPENED: dict[Path, NsysExport] = {}


def start(path: str | Path) -> None:
    """Sniff `path` and, for an nsys export, open it and start reading its large tables' first chunks; for a
    large torch.profiler file, start decoding its pieces. A file that cannot be read is left to the loader,
    which names what is wrong."""
    path = Path(path)
    found = sniff(path)
    _SNIFFED[path] = found
    if found.kineto and found.head is not None:
        kineto_json.start_read(path, found.head)
    if found.kineto or found.head is None:
        return
    try:
        export = NsysExport(path, found.head)
        _OPENED[path] = export
        for select in export.large_selects():
            export.ahead.update(start_chunks(export.path, export.conn, *select))
    except (TraceError, OSError, sqlite3.Error):
        return


def sniffed(path: Path) -> Sniffed:
    """The sniff `start` made of `path` (kept for the command: a file's first bytes do not change under
    it), else a new one (sniff.sniff)."""
    return _SNIFFED.get(Path(path)) or sniff(path)


def opened(path: Path, head: bytes | None = None) -> NsysExport:
    """The export `start` opened (its table reads already going), else the export opened now."""
    return _OPENED.pop(Path(path), None) or NsysExport(path, head)


def discard() -> None:
    """Close whatever was started and not taken (the run came from the cache, or failed first)."""
    _SNIFFED.clear()
    kineto_json.discard_started()
    while _OPENED:
        _OPENED.popitem()[1].close()
