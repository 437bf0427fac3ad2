"""The processes a profiled run started, read from /proc, so that a stopped run leaves none of them behind.

Killing nsys's process group is not enough with nsys 2022.4: it starts the program through nsys-launcher
in a session of its own (the program and its ranks are outside nsys's group), and its agent,
`nsys --start-agent --session-name=profile-<program>-<nsys pid>`, is a daemon (parent 1, its own session)
that an interrupted nsys often leaves running for good. Each process is known by (pid, start time), so
that a pid reused meanwhile is never signalled. Without /proc (not Linux) every set here is empty.

run_forwarding_output runs a profiled program this way: its output passed on (minus nsys's chatter and
Kineto's markers), and on timeout, Ctrl-C or SIGTERM everything it started stopped.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

from contract.nsys_cli import NsysError

Key = tuple[int, int]  # (pid, start time in clock ticks since boot)
Row = tuple[int, int, str, list[str], int]  # parent pid, start time, state, argv, process group
Table = dict[int, Row]
AGENT_FLAG = "--start-agent"
NSYS_SEMAPHORE = "/dev/shm/sem.nsys_sem_"  # + the pid of `nsys profile`

# nsys's own chatter (progress bars, file names); everything else the run prints is passed on.
_NSYS_CHATTER = re.compile(
    r"^\s*(\[\d+/\d+\]|Generating '|Generated:|Capture range (started|ended)"
    r"|Collecting data|Processing events|\S+\.(nsys-rep|qdstrm)\s*$)"
)
# Kineto's static-tracepoint markers, two per rank under torch.profiler. Kineto logs them at its USDT
# level, above ERROR, so KINETO_LOG_LEVEL can only silence them with its errors: they are cut out here
# (anywhere in a line: ranks writing at once run into each other's lines) and nothing else is.
_KINETO_MARKER = re.compile(
    r"USDT:\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \d+:\d+ SyncActivityProfilerHandler\.cpp:\d+\] profiler_(?:start|stop)"
)


def _read(pid: int) -> Row | None:
    """(parent pid, start time, state, argv, process group) of `pid`, or None when it is gone or unreadable."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) ": state, ppid, pgrp, ..., starttime
    return int(fields[1]), int(fields[19]), fields[0], argv, int(fields[2])


def _table() -> Table:
    """Every process that can be read now, by pid."""
    if not os.path.isdir("/proc"):
        return {}
    rows = {int(e): _read(int(e)) for e in os.listdir("/proc") if e.isdigit()}
    return {pid: row for pid, row in rows.items() if row is not None}


def agent_session(argv: list[str]) -> str | None:
    """The session an nsys agent serves (`profile-python-1234`), None for any other command line."""
    if AGENT_FLAG not in argv:
        return None
    return next((a.split("=", 1)[1] for a in argv if a.startswith("--session-name=")), None)


def run_tree(root: int) -> set[Key]:
    """The live descendants of `root` (itself left out), and the nsys agents named after one of them or `root`."""
    table = _table()
    ours = _descendants({root}, table)
    return _keys((ours - {root}) | _agents_of(ours, table), table)


def _descendants(roots: set[int], table: Table) -> set[int]:
    """`roots` and every process below them in `table`."""
    ours, frontier = set(roots), set(roots)
    while frontier:
        frontier = {pid for pid, row in table.items() if row[0] in frontier} - ours
        ours |= frontier
    return ours


def _agents_of(pids: set[int], table: Table) -> set[int]:
    """The nsys agents whose session is named after one of `pids` (`profile-<program>-<pid>`)."""
    tails = {f"-{pid}" for pid in pids}
    return {pid for pid, row in table.items() if (name := agent_session(row[3])) and name[name.rfind("-") :] in tails}


def _keys(pids: set[int], table: Table) -> set[Key]:
    return {(pid, table[pid][1]) for pid in pids if pid in table and table[pid][2] != "Z"}


def alive(keys: Iterable[Key]) -> set[Key]:
    """Those of `keys` still running (same pid and start time, not a zombie)."""
    left = set()
    for pid, started in keys:
        row = _read(pid)
        if row is not None and row[1] == started and row[2] != "Z":
            left.add((pid, started))
    return left


def stop(keys: Iterable[Key], grace_s: float = 5.0) -> set[Key]:
    """SIGTERM `keys`, SIGKILL those still running after `grace_s`; return any that survived both."""
    left = alive(keys)
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 2.0)):
        for pid, _ in left:
            with contextlib.suppress(OSError):  # gone meanwhile, or not ours to signal
                os.kill(pid, sig)
        deadline = time.monotonic() + wait_s
        while (left := alive(left)) and time.monotonic() < deadline:
            time.sleep(0.05)
        if not left:
            break
    return left


def stop_leftovers(started: set[Key], root: int, grace_s: float = 5.0) -> set[Key]:
    """After `root`, the leader of the run's process group, has exited: stop what it started that still runs
    (`started`, taken while it ran; what is left in its process group, where nsys's nsys-launcher stays once
    orphaned, as after an nsys that failed to start; what those started since; and every nsys agent named
    after one of them or `root`), remove the semaphore an nsys `root` leaves when stopped; return any process
    that survived."""
    table = _table()
    in_group = {pid for pid, row in table.items() if row[4] == root and pid != root}
    ours = _descendants({pid for pid, _ in alive(started)} | in_group, table)
    left = stop(_keys(ours | _agents_of(ours | {root}, table), table), grace_s)
    with contextlib.suppress(OSError):  # the named semaphore a stopped nsys leaves (nsys removes it on a normal exit)
        Path(f"{NSYS_SEMAPHORE}{root}").unlink(missing_ok=True)
    return left


def run_forwarding_output(
    cmd: Sequence[str],
    env: dict[str, str],
    timeout_s: float,
    keep: list[str] | None = None,
    tail: list[str] | None = None,
    keep_prefix: str = "",
) -> int:
    """Run `cmd` in its own process group, pass its output to our stderr minus nsys's progress bars.

    Lines starting with `keep_prefix` (what per-rank sessions report: profiling.session.RESULT_PREFIX) go
    to `keep` instead, without it, when given;
    `tail`, when given, receives the last lines passed on. On timeout or Ctrl-C everything the run
    started is stopped (profiling.processes): its process group, the program nsys runs in a session of
    its own, and nsys's agent; an agent left by an nsys that exited is stopped too.
    """
    proc = subprocess.Popen(
        list(cmd),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        start_new_session=True,
    )
    # A watchdog, because a hung run prints nothing for the read loop to notice.
    expired = threading.Event()

    def on_timeout() -> None:
        expired.set()
        _stop_group(proc)

    watchdog = threading.Timer(timeout_s, on_timeout)
    watchdog.daemon = True
    watchdog.start()
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            for part in _KINETO_MARKER.sub("", line.rstrip("\n")).split("\r"):
                if keep is not None and keep_prefix and part.startswith(keep_prefix):
                    keep.append(part[len(keep_prefix) :])
                elif part.strip() and not _NSYS_CHATTER.match(part):
                    print(part, file=sys.stderr, flush=True)
                    if tail is not None:
                        tail[:] = [*tail[-49:], part]
        rc = proc.wait()
    except BaseException:
        _stop_group(proc)
        raise
    finally:
        watchdog.cancel()
    stop_leftovers(set(), proc.pid)  # an nsys that failed may leave its agent running
    if expired.is_set():
        raise NsysError(f"the profiled run took longer than {timeout_s:.0f} s and was stopped")
    return rc


def _stop_group(proc: subprocess.Popen, grace_s: float = 5.0) -> None:
    """SIGTERM the run's process group (per-rank sessions pass it on to their nsys), then SIGKILL; then
    whatever it started outside that group (profiling.processes)."""
    started = run_tree(proc.pid)  # now, while the parent links still lead to them
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace_s)
    left = stop_leftovers(started, proc.pid, grace_s)
    if left:
        pids = ", ".join(str(pid) for pid, _ in sorted(left))
        print(f"[profiling] could not stop process(es) {pids} of the run", file=sys.stderr)


def exit_on_sigterm() -> None:
    """Turn SIGTERM into SystemExit, so that a stopped process still stops the runs it started."""
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
