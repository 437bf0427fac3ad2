"""Compressed exports read as they are: `unpacked(files, cache)` gives the paths to read.

A file named `.xz` (any content) or `.gz` holding a SQLite export is decompressed into its analysis cache folder
(key.cache_folder), as `unpacked-<key>/<name without .xz/.gz>`, where <key> identifies the compressed
file's content (key.file_state): one copy per content, read again on the next load, the copies of the
file's earlier states removed. Nothing is ever written beside the input but that cache folder. With the
cache off, or a cache folder that cannot be written, the copy goes to a temporary folder removed once
the files are read. A gzipped torch.profiler JSON file is left as it is: its reader decompresses it.
"""

from __future__ import annotations

import gzip
import lzma
import os
import shutil
import tempfile
import zlib
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager, suppress
from pathlib import Path

from analysis.cache.key import cache_enabled, cache_folder, file_state, key_of, note_off, umask
from analysis.errors import TraceError
from analysis.trace.readers.sniff import GZIP_MAGIC, SQLITE_MAGIC

XZ_MAGIC = b"\xfd7zXZ\x00"
PREFIX = "unpacked-"


def compression(path: Path) -> str | None:
    """ "xz" or "gz" when `path` must be decompressed before it is read, else None (gzipped JSON: None).
    Only a name ending in .xz or .gz is opened to look: every other file is read once, by its reader."""
    if path.suffix not in (".xz", ".gz") or path.name.endswith(".json.gz"):
        return None
    try:
        with open(path, "rb") as f:
            head = f.read(len(XZ_MAGIC))
        if head.startswith(XZ_MAGIC):
            return "xz"
        if head.startswith(GZIP_MAGIC):
            with gzip.open(path, "rb") as g:
                return "gz" if g.read(len(SQLITE_MAGIC)) == SQLITE_MAGIC else None
    except (OSError, EOFError, zlib.error):
        return None  # unreadable or damaged: the reader names what is wrong
    return None


@contextmanager
def unpacked(files: Sequence[Path], cache: bool | None = None) -> Iterator[list[Path]]:
    """The paths to read for `files`: each compressed one replaced by its decompressed copy (cached, or
    temporary until the block ends), the others as given."""
    with ExitStack() as stack:
        out = []
        for path in files:
            kind = compression(path)
            out.append(path if kind is None else _copy(path, kind, cache, stack))
        yield out


def _copy(path: Path, kind: str, cache: bool | None, stack: ExitStack) -> Path:
    """The decompressed copy of `path`: the cached one when it is there, else made now."""
    name = path.name.removesuffix(f".{kind}") if path.name.endswith(f".{kind}") else f"{path.name}.unpacked"
    if cache_enabled(cache):
        folder = cache_folder(path)
        entry = folder / f"{PREFIX}{key_of(file_state(path))}"
        if (entry / name).is_file():
            return entry / name
        try:
            return _store(path, kind, entry, name)
        except OSError as e:
            note_off(folder, e)
    temporary = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="analysis-unpacked-")))
    _decompress(path, kind, temporary / name)
    return temporary / name


def _store(path: Path, kind: str, entry: Path, name: str) -> Path:
    """Decompress into a temporary folder renamed to `entry` (a reader never sees half a copy); drop the
    copies of the file's other states."""
    entry.parent.mkdir(exist_ok=True)
    shutil.rmtree(entry, ignore_errors=True)  # an entry without its copy (removed in part): made anew
    tmp = Path(tempfile.mkdtemp(dir=entry.parent, prefix=".tmp-"))
    try:
        tmp.chmod(0o777 & ~umask())
        _decompress(path, kind, tmp / name)
        with suppress(OSError):  # another command made it first: the same bytes
            tmp.rename(entry)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for other in entry.parent.glob(f"{PREFIX}*"):
        if other != entry:
            shutil.rmtree(other, ignore_errors=True)
    return entry / name


def _decompress(path: Path, kind: str, target: Path) -> None:
    opener = lzma.open if kind == "xz" else gzip.open
    try:
        with opener(path, "rb") as src, open(target, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
    except (lzma.LZMAError, EOFError, gzip.BadGzipFile, zlib.error) as e:
        raise TraceError(f"{path}: truncated or corrupt {kind} file ({e})") from None
    os.chmod(target, 0o444 & ~umask())
