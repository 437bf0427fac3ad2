"""How a failed or stalled rank ends the job: the parent's side of `launcher.launch`.

`collect` waits for every rank's report. When one fails, it waits GRACE_S for the others' reports
and raises RankFailedError naming the root cause. A rank that died silently is the root cause;
otherwise, for a timeout in a collective that some rank never reached, that rank is; otherwise the
earliest error is. A collective still open past the process-group timeout (plus `watchdog_slack_s`)
stops the job even when no backend times out. `failure_message` is a rank's own one line for its
exception.
"""

from __future__ import annotations

import ctypes
import pickle
import queue as queue_module
import re
import time
from collections.abc import Collection, Sequence
from multiprocessing.process import BaseProcess
from multiprocessing.queues import Queue
from typing import Any

import torch.distributed as dist

from ddp.comm import inflight
from ddp.launch import gpu_sharing

GRACE_S = 1.0  # after a first failure, how long to collect the others before picking the root cause
TIMED_OUT = re.compile(r"timed? ?out|timeout", re.IGNORECASE)


class RankFailedError(RuntimeError):
    """A rank raised or died; `str()` is one line, `details` holds the rank's traceback if any."""

    def __init__(self, message: str, details: str = ""):
        super().__init__(message)
        self.details = details


def watchdog_slack_s(timeout_s: float) -> float:
    """How long past the process-group timeout the parent waits for the backend to give up first."""
    return max(5.0, 0.1 * timeout_s)


def failure_message(exc: BaseException) -> str:
    """One line for a rank's exception: NCCL's GPU-sharing refusal explained, a timeout with the
    collective this rank was in."""
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    explained = gpu_sharing.explain_failure(text)
    if explained:
        return explained
    line = text.splitlines()[0]
    where = inflight.position()
    if where.open_seq and (TIMED_OUT.search(text) or isinstance(exc, getattr(dist, "DistError", ()))):
        line += f" [{where.describe()}]"
    return line


def collect(
    procs: Sequence[BaseProcess],
    results: Queue[Any],
    slots: ctypes.Array[inflight.Slot] | None = None,
    timeout_s: float | None = None,
) -> Any:
    """Wait for every rank's report; on a failure, pick the root cause and raise it.

    With `slots` (the ranks' shared positions) and `timeout_s`, a collective still open well past the
    timeout stops the job even though no rank failed (a backend that never times out).
    """
    ok: dict[int, Any] = {}
    errors: dict[int, tuple[float, str, str]] = {}
    first_failure_at: float | None = None
    while len(ok) < len(procs):
        try:
            rank, status, payload = results.get(timeout=0.1)
            if status == "ok":
                ok[rank] = pickle.loads(payload)
            else:
                errors[rank] = payload
        except queue_module.Empty:
            pass
        silent = {
            r: p.exitcode for r, p in enumerate(procs) if p.exitcode is not None and r not in errors and r not in ok
        }
        # A rank that exited cleanly may still have its report in the queue: it only counts as silent
        # while that lasts, so the grace period restarts whenever nothing is wrong any more.
        if not (errors or silent):
            first_failure_at = None
        elif first_failure_at is None:
            first_failure_at = time.monotonic()
        positions = {r: inflight.read(slots[r]) for r in range(len(procs))} if slots is not None else {}
        if first_failure_at is not None and time.monotonic() - first_failure_at >= GRACE_S:
            raise_root_cause(errors, silent, positions, set(ok), timeout_s)
        if first_failure_at is None and timeout_s is not None:
            stop_a_hang(positions, set(ok), timeout_s)
    return ok[0]


def raise_root_cause(
    errors: dict[int, tuple[float, str, str]],
    silent: dict[int, int],
    positions: dict[int, inflight.Position] | None = None,
    finished: Collection[int] = frozenset(),
    timeout_s: float | None = None,
) -> None:
    """A rank that died without a word caused the rest; a timeout in a collective that some rank never
    reached was caused by that rank; otherwise the earliest error did."""
    positions = positions or {}
    if silent:
        rank, code = min(silent.items())
        how = (
            f"was killed by signal {-code}"
            if code < 0
            else f"exited with code {code}"
            if code
            else "exited with code 0"
        )
        where = f" ({positions[rank].describe()})" if rank in positions and positions[rank].issued else ""
        raise RankFailedError(f"rank {rank} {how} without reporting a result{where}; the other ranks were stopped")
    rank, (_, message, details) = min(errors.items(), key=lambda item: item[1][0])
    if TIMED_OUT.search(message) and rank in positions:
        stalled = inflight.describe_stall(positions, rank, finished, timeout_s) if positions[rank].open_seq else None
        if stalled:
            raise RankFailedError(f"{stalled} (rank {rank}: {message})", details)
        # A collective outside ddp.comm.collectives (e.g. DDP's own broadcasts): the ranks that neither failed
        # nor finished are the ones the others waited for.
        running = [r for r in sorted(positions) if r not in errors and r not in finished]
        if running:
            message += "; still running when it timed out: " + "; ".join(
                f"rank {r} {positions[r].describe()}" for r in running
            )
    raise RankFailedError(f"rank {rank} failed: {message}", details)


def stop_a_hang(positions: dict[int, inflight.Position], finished: set[int], timeout_s: float) -> None:
    """Raise when a rank has been in one collective for longer than the timeout plus some slack."""
    now = time.monotonic()
    late = [
        r
        for r, p in positions.items()
        if r not in finished and p.open_seq and now - p.open_since > timeout_s + watchdog_slack_s(timeout_s)
    ]
    if late:
        rank = min(late, key=lambda r: positions[r].open_since)
        stalled = inflight.describe_stall(positions, rank, finished, timeout_s, now)
        p = positions[rank]
        waiters = [r for r, q in sorted(positions.items()) if (q.open_seq, q.open_name) == (p.open_seq, p.open_name)]
        raise RankFailedError(
            stalled
            or (
                f"collective #{p.open_seq} {p.open_name} never completed: {inflight.ranks_text(waiters)} waited in it "
                f"past the process-group timeout ({timeout_s:.0f} s) and no rank failed ("
                + "; ".join(f"rank {r} {q.describe(now)}" for r, q in sorted(positions.items()))
                + "); the ranks were stopped"
            )
        )
