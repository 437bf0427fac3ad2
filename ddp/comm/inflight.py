"""Which collective each rank is in, so that a hang or a timeout names it.

`ddp.comm.instrumented` (every wrapper's collectives) and `ddp.comm.collectives.all_reduce` call `begin(name)`
before a collective and `end(seq)` once it completed (a blocking call returned, an async handle's wait returned
or its future completed without error).
A collective that fails stays open: the error report can then say "in comm:all_reduce:flat
(collective #12)". On CUDA an async collective counts as complete when its host-side future does,
which NCCL signals before the GPU finished: there the last collective issued is the best pointer.

Each process keeps its own record; a rank spawned by `ddp.launch.launcher` also mirrors it into a slot of
shared memory (`attach`), so that the parent can read every rank's position while one hangs or
after one died (`read`).
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

NAME_BYTES = 120


class Slot(ctypes.Structure):
    """One rank's position in shared memory (written by the rank, read by the launcher)."""

    _fields_ = [
        ("issued", ctypes.c_long),
        ("open_seq", ctypes.c_long),
        ("open_since", ctypes.c_double),
        ("open_name", ctypes.c_char * NAME_BYTES),
        ("last_name", ctypes.c_char * NAME_BYTES),
    ]


@dataclass(frozen=True)
class Position:
    """Collectives a rank issued, the oldest one not complete (seq 0: none) and since when (monotonic s)."""

    issued: int = 0
    open_seq: int = 0
    open_name: str = ""
    open_since: float = 0.0
    last_name: str = ""

    def describe(self, now: float | None = None) -> str:
        """E.g. 'in comm:all_reduce:flat (collective #12) for 3 s', or where the rank was last."""
        if self.open_seq:
            now = time.monotonic() if now is None else now
            return f"in {self.open_name} (collective #{self.open_seq}) for {max(0.0, now - self.open_since):.0f} s"
        if self.issued:
            return f"not in a collective (last: {self.last_name}, #{self.issued})"
        return "before its first collective"


_lock = threading.Lock()
_open: dict[int, tuple[str, float]] = {}  # seq -> (name, start); insertion order = issue order
_issued = 0
_last = ""
_slot: Slot | None = None


def attach(slot: Slot | None) -> None:
    """Mirror this process's record into `slot` from now on (None: stop)."""
    global _slot
    _slot = slot
    _publish()


def begin(name: str) -> int:
    """Record that collective `name` starts; returns its sequence number (1, 2, ...) for `end`."""
    global _issued, _last
    with _lock:
        _issued += 1
        _last = name
        _open[_issued] = (name, time.monotonic())
        if _slot is not None:
            _slot.issued = _issued
            _slot.last_name = name.encode()[: NAME_BYTES - 1]
            if len(_open) == 1:  # it is the oldest open one
                _publish_oldest(_slot)
        return _issued


def end(seq: int) -> None:
    """Record that collective `seq` completed (twice is fine)."""
    with _lock:
        was_oldest = bool(_open) and next(iter(_open)) == seq
        if _open.pop(seq, None) is not None and was_oldest and _slot is not None:
            _publish_oldest(_slot)


def position() -> Position:
    """This process's position now."""
    with _lock:
        return _position()


def _position() -> Position:
    if _open:
        seq, (name, since) = next(iter(_open.items()))
        return Position(_issued, seq, name, since, _last)
    return Position(_issued, 0, "", 0.0, _last)


def _publish() -> None:
    """Write the whole record into the slot (called with the lock held, or before any collective)."""
    if _slot is None:
        return
    _slot.issued = _issued
    _slot.last_name = _last.encode()[: NAME_BYTES - 1]
    _publish_oldest(_slot)


def _publish_oldest(slot: Slot) -> None:
    """Write the oldest open collective (or none) into `slot`; `begin`/`end` call it only when it changed."""
    if _open:
        seq, (name, since) = next(iter(_open.items()))
        slot.open_seq, slot.open_since, slot.open_name = seq, since, name.encode()[: NAME_BYTES - 1]
    else:
        slot.open_seq = 0


def read(slot: Slot) -> Position:
    """A rank's position from its shared slot (a diagnostic: a read during a write may mix two states)."""
    return Position(
        slot.issued,
        slot.open_seq,
        slot.open_name.decode(errors="replace"),
        slot.open_since,
        slot.last_name.decode(errors="replace"),
    )


class TrackedWork:
    """An async collective's handle that ends its record when its wait returns or its future completes."""

    def __init__(self, work: Any, seq: int):
        self._work, self._seq = work, seq
        future = getattr(work, "get_future", None)
        if future is not None:
            future().add_done_callback(self._future_done)

    def _future_done(self, fut: Any) -> None:
        try:
            fut.value()
        except Exception:  # a failed collective stays open, for the error report
            return
        end(self._seq)

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        result = self._work.wait(*args, **kwargs)
        end(self._seq)
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self._work, name)


def describe_stall(
    positions: dict[int, Position],
    waiting: int,
    finished: Collection[int] = frozenset(),
    timeout_s: float | None = None,
    now: float | None = None,
) -> str | None:
    """'rank 1 stalled: never reached collective #12 comm:all_reduce:flat, ...' when some unfinished
    rank issued fewer collectives than the one `waiting` is in; None when every rank reached it."""
    p = positions[waiting]
    behind = sorted(r for r, q in positions.items() if r not in finished and q.issued < p.open_seq)
    if not behind:
        return None
    waiters = sorted(r for r, q in positions.items() if q.open_seq == p.open_seq and q.open_name == p.open_name)
    limit = f" ({timeout_s:.0f} s)" if timeout_s is not None else ""
    return (
        f"{ranks_text(behind)} stalled: never reached collective #{p.open_seq} {p.open_name}, in which "
        f"{ranks_text(waiters)} waited until the process-group timeout{limit}; "
        + "; ".join(f"rank {r} was {positions[r].describe(now)}" for r in behind)
        + "; the ranks were stopped"
    )


def ranks_text(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))
