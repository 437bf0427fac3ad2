"""The load cache: a run's loaded Trace kept beside its first file, read back instead of the export the
next time the same files are loaded with the same patterns by the same code (`cached_load`).

An entry is a folder `trace-<key>` in the first file's cache folder (key.cache_folder:
`.<name>.analysis-cache/` beside it), holding the Trace (cache/trace_store.py) and `key.json`. The key
covers every file of the run (key.file_state: path, size, mtime_ns, sampled hash), the paths as
given (Trace.path shows them), the patterns and the code's fingerprint. An entry is written into a
temporary folder and renamed into place, so a reader never sees half of one; when two commands write
the same entry at once, the second rename fails and its copy is dropped. Entries of the same files
in another state or from other code are removed when a new one is written. A folder that cannot be
written (read-only, disk full) leaves the load as it was, with one note on stderr.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from analysis.cache.key import (
    cache_enabled,
    cache_folder,
    code_fingerprint,
    drop_stale,
    key_of,
    note_off,
    states,
    umask,
)
from analysis.trace.patterns import Patterns

if TYPE_CHECKING:
    from analysis.trace.frames import Trace

KEY = "key.json"


def cached_load(
    files: Sequence[Path], patterns: Patterns, load: Callable[[], Trace], cache: bool | None = None
) -> Trace:
    """The Trace of `files` from the cache when an entry matches, else `load()` stored for next time."""
    found = _entry(files, patterns, cache)
    if found is None:
        return load()
    entry, key = found
    if (entry / KEY).is_file():
        from analysis.cache.trace_store import read_saved  # deferred: pandas and pyarrow

        try:
            return read_saved(entry)
        except (OSError, ValueError, KeyError, TypeError):  # removed under us, or damaged: load it anew
            shutil.rmtree(entry, ignore_errors=True)
    trace = load()
    _store(trace, entry, key)
    return trace


def holds(files: Sequence[Path], patterns: Patterns, cache: bool | None = None) -> bool:
    """Whether cached_load would read this load from the cache (no pandas imported to say so)."""
    found = _entry(files, patterns, cache)
    return found is not None and (found[0] / KEY).is_file()


def _entry(files: Sequence[Path], patterns: Patterns, cache: bool | None) -> tuple[Path, dict] | None:
    """The cache entry's folder and key for this load; None when the cache is off or a file unreadable."""
    if not cache_enabled(cache):
        return None
    try:
        found = states(files)
    except OSError:  # not a plain readable file (the reader says what is wrong)
        return None
    key = {
        "given": [str(p) for p in files],
        "files": found,
        "patterns": asdict(patterns),
        "code": code_fingerprint(),
    }
    return cache_folder(files[0]) / f"trace-{key_of(key)}", key


def _store(trace: Trace, entry: Path, key: dict) -> None:
    """Write the entry through a temporary folder renamed into place; drop stale siblings."""
    folder = entry.parent
    tmp: Path | None = None
    try:
        folder.mkdir(exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=folder, prefix=".tmp-"))
        tmp.chmod(0o777 & ~umask())  # as mkdir would make it (mkdtemp's is 0700)
        from analysis.cache.trace_store import save_trace  # deferred: pandas and pyarrow

        save_trace(trace, tmp)
        (tmp / KEY).write_text(json.dumps(key))  # last: an entry with its key is whole
        try:
            tmp.rename(entry)
            tmp = None
        except OSError:  # another command wrote it first: theirs is the same
            pass
        drop_stale(
            folder.glob("trace-*"), entry, key, lambda p: p / KEY, lambda p: shutil.rmtree(p, ignore_errors=True)
        )
    except OSError as e:
        note_off(folder, e)
    except TypeError:  # a field the store cannot write: no entry
        pass
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
