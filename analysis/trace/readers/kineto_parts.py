"""Decode one large Kineto file's event array on several cores: `decode_in_parts`.

The event text is cut at event boundaries into contiguous pieces, one per usable core (at most
MAX_PARTS, none smaller than PART_BYTES); this process decodes the first piece while forked workers
decode the others, and the pieces' columns come back in file order, so the result is the serial
decode's. Forked workers inherit the (memory-mapped) text and the decode function instead of
receiving them pickled; only the columns travel back. A piece boundary is a `}`, `,` `{` match like a
batch boundary: one that falls inside a string or a nested object makes its pieces fail to decode,
and the caller then decodes the whole file its slow, serial way (which also names the fault).
Small files, one-core machines, daemonic processes (which may not start children) and threads other
than the main one (Dask's task threads) decode in one piece, here.
"""

from __future__ import annotations

import mmap
import multiprocessing
import os
import re
import threading
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

PART_BYTES = 64 * 2**20  # no piece smaller than this: below, a worker's start costs more than it saves
MAX_PARTS = 4

Decode = Callable[[int, int], list]  # (start, stop) of event text -> its batches' columns
_JOB: tuple[Decode, list[tuple[int, int]]] | None = None  # set for the forked workers: inherited, not pickled


def usable_cores() -> int:
    """Cores this process may run on; 1 where it should not fork workers: a daemonic process (not allowed
    children) or a thread other than the main one (Dask runs tasks on worker threads; a fork there could
    copy a lock another thread holds)."""
    if multiprocessing.current_process().daemon or threading.current_thread() is not threading.main_thread():
        return 1
    if "fork" not in multiprocessing.get_all_start_methods():  # Windows: the workers could not inherit the text
        return 1
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def pieces(data: bytes | mmap.mmap, start: int, stop: int, cut: re.Pattern[bytes]) -> list[tuple[int, int]]:
    """(start, stop) of contiguous pieces of the event text data[start:stop] (from an event's `{` to an
    event's `}`), cut where `cut` matches after each piece's share of the text."""
    parts = max(1, min(usable_cores(), MAX_PARTS, (stop - start) // PART_BYTES))
    spans, begin = [], start
    for i in range(1, parts):
        match = cut.search(data, max(begin + 1, start + (stop - start) * i // parts), stop)
        if match is None:
            break
        spans.append((begin, match.start() + 1))
        begin = match.end() - 1
    return [*spans, (begin, stop)]


def _run_piece(index: int) -> list:
    assert _JOB is not None, "run in a worker forked by decode_in_parts"
    decode, spans = _JOB
    return decode(*spans[index])


def decode_in_parts(decode: Decode, spans: list[tuple[int, int]]) -> list:
    """decode(start, stop) of every span, concatenated in order: the first here, the others in forked
    workers; serially here when workers cannot be started (or die)."""
    global _JOB
    if len(spans) == 1:
        return decode(*spans[0])
    _JOB = (decode, spans)
    try:
        with ProcessPoolExecutor(len(spans) - 1, mp_context=multiprocessing.get_context("fork")) as pool:
            others = [pool.submit(_run_piece, i) for i in range(1, len(spans))]
            first = decode(*spans[0])
            return first + [batch for piece in others for batch in piece.result()]
    except (BrokenProcessPool, OSError):  # a worker killed (memory) or none started: the serial way
        return [batch for span in spans for batch in decode(*span)]
    finally:
        _JOB = None
