"""The processes the tests start, found by a token in their environment and ended whatever happens.

Every process the suite starts carries `DDP_TEST_OWNER=<token>` in its environment. The environment is
inherited through fork and exec, by nsys's launcher, torchrun's agents and multiprocessing's spawned
ranks, and survives what escapes a process-group kill: a new session (nsys starts the profiled program
in one) and the reparenting to init of a process whose parent died. So the processes carrying a token
are exactly those started under it, however late they started: no before/after snapshot misses a rank
spawned after it.

The suite's conftest gives each test a token of its own and ends what carries it when the test is done;
`run` and `popen` give one command a token and end its processes when it returns, times out or raises.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
import uuid
from collections.abc import Iterable, Iterator

from profiling import processes

OWNER_ENV = "DDP_TEST_OWNER"
# Started once by the pytest process for the whole session (analysis' process pools use a forkserver):
# not a test's leftovers even when the test that first needed them started them.
_SESSION_HELPERS = ("multiprocessing.forkserver", "multiprocessing.resource_tracker")


def new_token(parent: str | None = None) -> str:
    """A fresh token, under `parent` (`parent/xxxxxxxx`) when given."""
    tail = uuid.uuid4().hex[:12]
    return f"{parent}/{tail}" if parent else f"pytest-{os.getpid()}-{tail}"


def pids() -> set[str]:
    """The pids now running (as /proc names them; empty without /proc)."""
    return {e for e in os.listdir("/proc") if e.isdigit()} if os.path.isdir("/proc") else set()


def carrying(token: str, below: bool = False, among: Iterable[str] | None = None) -> set[processes.Key]:
    """The live processes (not this one, `among` these pids if given) whose environment holds `token`,
    and, with `below`, any token under it."""
    needle = f"\0{OWNER_ENV}={token}".encode()
    ends = (b"\0", b"/") if below else (b"\0",)  # what may follow the token
    found = set()
    for entry in pids() if among is None else among:
        if int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = b"\0" + f.read() + b"\0"
            at = env.find(needle)
            if at < 0 or not env[at + len(needle) :].startswith(ends):
                continue
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:  # gone meanwhile
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # state, ppid, ..., starttime
        if fields[0] != "Z" and not _session_helper(int(fields[1]), int(entry)):
            found.add((int(entry), int(fields[19])))
    return found


def _session_helper(ppid: int, pid: int) -> bool:
    if ppid != os.getpid():
        return False
    with contextlib.suppress(OSError), open(f"/proc/{pid}/cmdline", "rb") as f:
        cmdline = f.read()
        return any(name.encode() in cmdline for name in _SESSION_HELPERS)
    return False


def describe(keys: Iterable[processes.Key]) -> list[str]:
    """`pid command line` of each process, for a message."""
    lines = []
    for pid, _ in sorted(keys):
        with contextlib.suppress(OSError), open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            lines.append(f"{pid} {cmd[:160].strip()}")
    return lines


def end_all(token: str, below: bool = False, wait_s: float = 3.0, among: Iterable[str] | None = None) -> list[str]:
    """Give the processes carrying `token` (`among` these pids if given) `wait_s` to exit by themselves,
    then stop the rest (SIGTERM, then SIGKILL); return those that had to be stopped, described."""
    left = carrying(token, below, among)
    deadline = time.monotonic() + wait_s
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = processes.alive(left)
    if not left:
        return []
    said = describe(left)
    processes.stop(left, grace_s=2.0)
    return said


def env_with(token: str, env: dict[str, str] | None = None) -> dict[str, str]:
    """`env` (default: this process's environment) carrying `token`."""
    return {**(os.environ if env is None else env), OWNER_ENV: token}


@contextlib.contextmanager
def popen(cmd: list[str], env: dict[str, str] | None = None, **kwargs) -> Iterator[subprocess.Popen]:
    """subprocess.Popen(cmd) under a token of its own; on leaving, every process it started is ended."""
    token = new_token(os.environ.get(OWNER_ENV))
    proc = subprocess.Popen(cmd, env=env_with(token, env), **kwargs)
    try:
        yield proc
    finally:
        with contextlib.suppress(OSError):
            proc.kill()
        end_all(token, wait_s=0.5)  # before reaping: a grandchild may hold its pipes open
        proc.communicate(timeout=30)


def run(cmd: list[str], timeout: float, env: dict[str, str] | None = None, **kwargs) -> subprocess.CompletedProcess:
    """subprocess.run(cmd, timeout=...) whose every process, children and grandchildren in sessions of
    their own included, is ended when it returns, times out or raises."""
    token = new_token(os.environ.get(OWNER_ENV))
    try:
        return subprocess.run(cmd, env=env_with(token, env), timeout=timeout, **kwargs)
    finally:
        end_all(token, wait_s=0.5)
