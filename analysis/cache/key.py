"""The analysis cache's keys and its folder: what identifies a file's content, the code, and where a cache
entry lives (`<folder>/.<file name>.analysis-cache/`, beside the export, never inside it).

Light on purpose (os, hashlib, json): the table CLIs compute a key before they import pandas, to print
an answer they have already given (cache/answers.py). The loaded traces stored under the same folder
(cache/loads.py) use the same keys.

A file's key is its resolved path, size, mtime_ns and a hash of samples of its bytes (the first and last
64 KiB and 64 blocks of 4 KiB spread evenly between them): about 0.5 MiB read whatever the file's size,
where hashing a 1 GB export whole would cost about a second on every look. An SQLite export's first page
holds the file change counter, which every write transaction bumps, so the head sample alone catches a
rewrite in place that kept the size and the mtime.

Set ANALYSIS_NO_CACHE=1 (the test suite does), pass `--no-cache` (every analysis CLI) or `cache=False`
(open_runs, load_trace) to neither read nor write a cache.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import Any

NO_CACHE_ENV = "ANALYSIS_NO_CACHE"  # set (to anything but "" or "0"): no cache read or written
FORMAT = 1  # bumped when what a cache entry holds changes shape
HEAD = 64 * 1024  # bytes hashed at the start and at the end of a file
BLOCKS, BLOCK = 64, 4096  # blocks hashed evenly between them
PACKAGES = ("numpy", "pandas", "pyarrow")  # their versions are part of the code's fingerprint
REPO = Path(__file__).resolve().parents[2]
SOURCES = ("analysis", "contract")  # the code whose output is cached


def cache_enabled(cache: bool | None = None) -> bool:
    """cache when given, else on unless ANALYSIS_NO_CACHE is set."""
    if cache is not None:
        return cache
    return os.environ.get(NO_CACHE_ENV, "") in ("", "0")


@contextmanager
def cache_off() -> Iterator[None]:
    """ANALYSIS_NO_CACHE set while inside (process pools started then inherit it), as it was after."""
    before = os.environ.get(NO_CACHE_ENV)
    os.environ[NO_CACHE_ENV] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(NO_CACHE_ENV, None)
        else:
            os.environ[NO_CACHE_ENV] = before


def cache_folder(path: str | Path) -> Path:
    """Where the cache of the export at `path` lives: a hidden folder beside it, named after it."""
    p = Path(path).resolve()
    return p.parent / f".{p.name}.analysis-cache"


def sampled_hash(path: str | Path, size: int) -> str:
    """blake2b of the file's first and last HEAD bytes and BLOCKS blocks spread evenly between (all of
    it when smaller)."""
    h = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        if size <= 2 * HEAD + BLOCKS * BLOCK:
            h.update(f.read())
            return h.hexdigest()
        h.update(f.read(HEAD))
        stride = (size - 2 * HEAD) // BLOCKS
        for i in range(BLOCKS):
            f.seek(HEAD + i * stride)
            h.update(f.read(BLOCK))
        f.seek(size - HEAD)
        h.update(f.read(HEAD))
    return h.hexdigest()


def file_state(path: str | Path) -> dict[str, Any]:
    """What identifies a file's content: resolved path, size, mtime_ns, sampled hash (OSError when unreadable)."""
    p = Path(path).resolve()
    st = p.stat()
    return {"path": str(p), "size": st.st_size, "mtime_ns": st.st_mtime_ns, "sample": sampled_hash(p, st.st_size)}


def _versions() -> dict[str, str]:
    """numpy's, pandas' and pyarrow's versions from their dist-info folders (importing them costs 0.5 s)."""
    from importlib.util import find_spec

    found: dict[str, str] = {}
    for name in PACKAGES:
        spec = find_spec(name)
        if spec is None or spec.origin is None:
            continue
        site = Path(spec.origin).parent.parent
        for entry in os.listdir(site):
            if entry.startswith(f"{name}-") and entry.endswith(".dist-info"):
                found[name] = entry.removeprefix(f"{name}-").removesuffix(".dist-info")
    return found


@cache
def code_fingerprint() -> str:
    """A hash of the cache format, the analysis and contract packages' sources, Python's and the
    dataframe libraries' versions: any change makes every cache entry stale."""
    h = hashlib.blake2b(digest_size=16)
    h.update(json.dumps([FORMAT, sys.version, _versions()]).encode())
    for folder in SOURCES:
        for source in sorted((REPO / folder).rglob("*.py")):
            h.update(str(source.relative_to(REPO)).encode())
            h.update(source.read_bytes())
    return h.hexdigest()


def key_of(parts: Any) -> str:
    """A hex digest of `parts` (anything json can write) as canonical JSON."""
    return hashlib.blake2b(json.dumps(parts, sort_keys=True, default=str).encode(), digest_size=16).hexdigest()


def write_file_atomic(path: Path, data: bytes) -> None:
    """Write `data` to `path` through a temporary file in the same folder renamed over it: a reader sees
    the old file, the new one, or none, never half of one; two writers: the last rename wins."""
    path.parent.mkdir(exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o666 & ~umask())  # as an open() would make it (mkstemp's is 0600)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def umask() -> int:
    """The process's umask (read by setting it and setting it back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


_noted: set[str] = set()


def note_off(where: Path, error: OSError) -> None:
    """One line on stderr, once per folder, when a cache cannot be written (a read-only folder, a full
    disk): the command goes on without it."""
    folder = str(where)
    if folder in _noted:
        return
    _noted.add(folder)
    print(f"note: no analysis cache in {folder}: {error.strerror or error}", file=sys.stderr, flush=True)


def states(paths: Iterable[str | Path]) -> list[dict[str, Any]]:
    """file_state of each path, in order."""
    return [file_state(p) for p in paths]


def drop_stale(
    entries: Iterable[Path], kept: Path, key: dict, key_file: Callable[[Path], Path], remove: Callable[[Path], None]
) -> None:
    """`remove` every entry but `kept` whose key (the JSON at `key_file(entry)`) is stale against `key`
    (is_stale); an entry whose key cannot be read is left alone (being written, or not ours to judge)."""
    for other in entries:
        if other == kept:
            continue
        try:
            theirs = json.loads(key_file(other).read_text())
        except (OSError, ValueError):
            continue
        if is_stale(theirs, key):
            remove(other)


def is_stale(theirs: dict, key: dict) -> bool:
    """Whether an entry keyed `theirs` is of other code, or of a file of `key` in another state."""
    now = {f["path"]: f for f in key["files"]}
    if theirs.get("code") != key["code"]:
        return True
    return any(f.get("path") in now and f != now[f["path"]] for f in theirs.get("files", []))
