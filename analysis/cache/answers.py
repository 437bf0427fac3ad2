"""The answer cache: what a table command printed, printed again for the same question without importing
pandas or reading the trace (`answered(command, args, body)`).

The table CLIs (overlap, collectives, advise) parse their options with argparse alone, then look here:
the key is the command, its options (all but --jobs/--dask, which do not change what it prints), the
paths as given with each file's state (key.file_state) and the code's fingerprint. A hit prints
the stored stdout and stderr and returns the stored exit code; a miss runs the command with its output
copied as it is written, and keeps it when the command succeeded (exit 0) and its reader took it all
(no closed pipe). Progress lines are not kept (a hit does no work to report). The entry is one JSON
file, `answer-<key>.json` in the first file's cache folder, written through a temporary file renamed
into place; answers for the same files in another state, or from other code, are removed then.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TextIO

from analysis.cache.key import (
    cache_enabled,
    cache_folder,
    cache_off,
    code_fingerprint,
    drop_stale,
    key_of,
    note_off,
    states,
    write_file_atomic,
)

UNKEYED = ("jobs", "dask", "no_cache")  # options that change how a command works, not what it prints
MAX_ANSWER = 32 * 2**20  # longer answers are not kept (a per-call CSV of a huge run)


class _Copy:
    """A text stream that copies what is written to it (and notes a reader that closed the pipe)."""

    def __init__(self, stream: TextIO):
        self.stream, self.broken = stream, False
        self.parts: list[str] = []
        self.size = 0

    def write(self, text: str) -> int:
        self.parts.append(text)
        self.size += len(text)
        try:
            return self.stream.write(text)
        except BrokenPipeError:
            self.broken = True
            raise

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def answered(command: str, args: argparse.Namespace, body: Callable[[], int], writes: Sequence[str] = ()) -> int:
    """body()'s exit code, or the stored one with its output printed when this question was answered
    before. `writes`: options that make the command write files (no answer is kept or printed then).
    --no-cache: neither this nor the load cache, in this process or its helpers, while body() runs."""
    if getattr(args, "no_cache", False):
        with cache_off():
            return body()
    if not cache_enabled() or getattr(args, "export", False) or any(getattr(args, w, None) for w in writes):
        return body()
    try:
        key = {
            "command": command,
            "options": {k: v for k, v in sorted(vars(args).items()) if k not in UNKEYED},
            "files": states(args.paths),
            "code": code_fingerprint(),
        }
    except OSError:  # a path that is not a readable file: the command says what is wrong
        return body()
    entry = cache_folder(args.paths[0]) / f"answer-{key_of(key)}.json"
    stored = _read(entry)
    if stored is not None:
        sys.stdout.write(stored["stdout"])
        sys.stdout.flush()
        sys.stderr.write(stored["stderr"])
        return int(stored["rc"])
    return _run_and_keep(command, body, entry, key)


def _read(entry: Path) -> dict | None:
    try:
        doc = json.loads(entry.read_text())
        return doc if {"stdout", "stderr", "rc"} <= doc.keys() else None
    except (OSError, ValueError):
        return None


def _run_and_keep(command: str, body: Callable[[], int], entry: Path, key: dict) -> int:
    out, err = _Copy(sys.stdout), _Copy(sys.stderr)
    sys.stdout, sys.stderr = out, err
    try:
        rc = body()
    finally:
        sys.stdout, sys.stderr = out.stream, err.stream
    if rc != 0 or out.broken or err.broken or out.size + err.size > MAX_ANSWER:
        return rc
    dropped = (f"[{command}]", "note: no analysis cache")  # progress lines; a cache's note is its own
    kept_err = "".join(line for line in "".join(err.parts).splitlines(True) if not line.startswith(dropped))
    doc = {**key, "stdout": "".join(out.parts), "stderr": kept_err, "rc": rc}
    try:
        write_file_atomic(entry, json.dumps(doc).encode())
        # answers about these files in another state or from other code
        drop_stale(entry.parent.glob("answer-*.json"), entry, key, lambda p: p, lambda p: p.unlink(missing_ok=True))
    except OSError as e:
        note_off(entry.parent, e)
    return rc
