"""A trace file's format from its first bytes, read once: `sniff(path) -> Sniffed`.

The one look at a file before it is read: torch.profiler JSON (gzipped, or text whose first non-blank
byte is `{` or `[`) goes to kineto.py, everything else to nsys.py, which checks the same first bytes
(the SQLite header: magic, page size and count) without opening the file again. A path that cannot be
opened is handed to the nsys reader, whose checks name what is wrong (missing, a directory, unreadable).
The formats' first bytes (GZIP_MAGIC, SQLITE_MAGIC) are named here once, for the readers and for the
cache's unpacking of compressed exports (cache/unpacked.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

GZIP_MAGIC = b"\x1f\x8b"
SQLITE_MAGIC = b"SQLite format 3\x00"
HEAD_BYTES = 4096  # enough for the SQLite header (100 bytes) and for JSON's first non-blank byte


@dataclass(frozen=True)
class Sniffed:
    """A file's format ("kineto" or "nsys") and its first bytes (None when it could not be opened)."""

    path: Path
    kind: str
    head: bytes | None

    @property
    def kineto(self) -> bool:
        return self.kind == "kineto"


def sniff(path: str | Path) -> Sniffed:
    """Open `path` once and say which reader takes it, keeping its first HEAD_BYTES bytes for that reader."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            head = f.read(HEAD_BYTES)
    except OSError:
        return Sniffed(path, "nsys", None)  # the nsys reader reports a missing or unreadable path
    json = head[:2] == GZIP_MAGIC or head.lstrip()[:1] in (b"{", b"[")
    return Sniffed(path, "kineto" if json else "nsys", head)
