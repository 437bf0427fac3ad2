"""Decode one large Kineto file's event array on several cores: `decode_in_parts`, `Workers`.

The event text is cut at event boundaries into contiguous pieces, one per usable core (at most
MAX_PARTS, none smaller than PART_BYTES); this process decodes the first piece while forked workers
decode the others, and the pieces' columns come back in file order, so the result is the serial
decode's. Forked workers inherit the (memory-mapped) text and the decode function instead of
receiving them pickled; only the columns travel back, pickled into an anonymous in-memory file, and a
worker then ends at once (os._exit: nothing of the parent's to clean up or flush). A CLI starts workers for every piece
before it imports the analysis (read_ahead.py, kineto_json.start_read), so the file decodes while
pandas loads. A piece boundary is a `}`, `,` `{` match like a batch boundary: one that falls inside a
string or a nested object makes its pieces fail to decode, and the caller then decodes the whole file
its slow, serial way (which also names the fault). A worker that dies (the kernel's OOM killer) leaves
its piece to this process. Small files, one-core machines, daemonic processes and threads other than
the main one (Dask's task threads: a fork there could copy a lock another thread holds) decode in one
piece, here.
"""

from __future__ import annotations

import contextlib
import mmap
import multiprocessing
import os
import pickle
import re
import signal
import tempfile
import threading
from collections.abc import Callable
from typing import BinaryIO

PART_BYTES = 64 * 2**20  # no piece smaller than this: below, a worker's start costs more than it saves
MAX_PARTS = 4

Decode = Callable[[int, int], list]  # (start, stop) of event text -> its batches' columns


def usable_cores() -> int:
    """Cores this process may run on; 1 where it should not fork workers: a daemonic process (not allowed
    children) or a thread other than the main one."""
    if multiprocessing.current_process().daemon or threading.current_thread() is not threading.main_thread():
        return 1
    if not hasattr(os, "fork"):  # Windows: the workers could not inherit the text
        return 1
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _parts(size: int) -> int:
    """How many pieces text of `size` bytes is cut into on this machine (one core and PART_BYTES a piece)."""
    return max(1, min(usable_cores(), MAX_PARTS, size // PART_BYTES))


def cut_worth(size: int) -> bool:
    """Whether text of `size` bytes would be cut into pieces on this machine (pieces() gives two or more)."""
    return _parts(size) > 1


def pieces(data: bytes | mmap.mmap, start: int, stop: int, cut: re.Pattern[bytes]) -> list[tuple[int, int]]:
    """(start, stop) of contiguous pieces of the event text data[start:stop] (from an event's `{` to an
    event's `}`), cut where `cut` matches after each piece's share of the text."""
    parts = _parts(stop - start)
    spans, begin = [], start
    for i in range(1, parts):
        match = cut.search(data, max(begin + 1, start + (stop - start) * i // parts), stop)
        if match is None:
            break
        spans.append((begin, match.start() + 1))
        begin = match.end() - 1
    return [*spans, (begin, stop)]


class Workers:
    """One forked process per span, each running decode(*span); `results()` gathers them in span order."""

    def __init__(self, decode: Decode, spans: list[tuple[int, int]]):
        self.decode, self.spans = decode, spans
        self.running: list[tuple[int, BinaryIO]] = []  # (pid, the file its result is written to)
        try:
            for span in spans:
                self.running.append(self._fork(span))
        except OSError:  # no process could start (memory, limits): the rest is decoded here
            pass

    def _fork(self, span: tuple[int, int]) -> tuple[int, BinaryIO]:
        out = _result_file()
        try:
            pid = os.fork()
        except OSError:
            out.close()
            raise
        if pid == 0:  # the worker: decode, write, end (never returns)
            _work(self.decode, span, out)
        return pid, out

    def results(self) -> list:
        """Every span's decode, concatenated in order; a span whose worker died (or never started) is
        decoded here. A worker's exception (a TraceError: the piece is not valid JSON) is raised here."""
        out = []
        for span in self.spans:  # the first len(running) spans have workers, in order
            got = _received(*self.running.pop(0)) if self.running else None
            out += self.decode(*span) if got is None else got
        return out

    def close(self) -> None:
        """Stop and reap the workers whose results were not taken (the command failed or went another way)."""
        for pid, out in self.running:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            out.close()
        self.running = []


def _result_file() -> BinaryIO:
    """An anonymous file in memory (a file on /tmp where there is no memfd) that a worker writes its result
    to: written at memory speed, where a pipe would pass it 64 kB at a time between the two processes."""
    if hasattr(os, "memfd_create"):
        with contextlib.suppress(OSError):
            return open(os.memfd_create("kineto-piece"), "w+b")
    return tempfile.TemporaryFile()


def _work(decode: Decode, span: tuple[int, int], out: BinaryIO) -> None:
    """A worker's life: its span's columns (or the exception that stopped them) pickled to `out`, then
    os._exit, which runs none of the parent's exit handlers and flushes none of its buffers. Exit status 0
    says the result is whole."""
    code = 1
    try:
        result: tuple[bool, object]
        try:
            result = (True, decode(*span))
        except Exception as e:  # written, raised by the parent
            result = (False, e)
        pickle.dump(result, out, protocol=pickle.HIGHEST_PROTOCOL)
        out.flush()
        code = 0
    finally:
        os._exit(code)  # an error writing (disk full, an unpicklable exception): the parent decodes the span


def _received(pid: int, out: BinaryIO) -> list | None:
    """The result a worker wrote, once it has ended; None when it did not end well (killed, failed to write)."""
    try:
        _, status = os.waitpid(pid, 0)
        if status != 0:
            return None
        out.seek(0)
        ok, value = pickle.load(out)
    except (EOFError, pickle.UnpicklingError):  # a result cut short (the file could not take it all)
        return None
    finally:
        out.close()
    if not ok:
        raise value
    return value


def decode_in_parts(decode: Decode, spans: list[tuple[int, int]]) -> list:
    """decode(start, stop) of every span, concatenated in order: the first here, the others in forked
    workers; here when workers cannot be started (or die)."""
    if len(spans) == 1:
        return decode(*spans[0])
    workers = Workers(decode, spans[1:])
    try:
        first = decode(*spans[0])
        return first + workers.results()
    finally:
        workers.close()
