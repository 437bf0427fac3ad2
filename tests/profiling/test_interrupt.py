"""Ctrl-C during a real `run_nsys.sh` recording leaves no process behind: not nsys, not the ranks, and not
the agent nsys 2022.4 starts as a daemon of its own (`nsys --start-agent --session-name=profile-<prog>-<nsys
pid>`, parent 1, its own session), which outlived the run when the interrupt came while the capture was open.

The run is started as a shell starts a foreground command, SIGINT at its default: a suite started in the
background by a non-interactive shell (`bash scripts/test.sh &`) ignores SIGINT, and every process it starts
inherits that, so run_nsys.sh would never see the Ctrl-C. What the run leaves is found by the token its
processes carry (tests/support/owned.py), ranks spawned after any look at the process tree included."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.profiling.test_nsys import REPO
from tests.support import owned
from tests.support.nsys import RECORDS_WITH_NSYS

pytestmark = RECORDS_WITH_NSYS

Process = tuple[int, str, str, str]  # parent pid, start time, state, command line
# exec the command with SIGINT at its default, whatever this process inherited (an ignored signal stays
# ignored across exec, and bash cannot reset one it was started ignoring)
AS_IN_A_TERMINAL = [
    sys.executable,
    "-c",
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execvp(sys.argv[1], sys.argv[1:])",
]


def processes() -> dict[int, Process]:
    """Every live process by pid, read from /proc."""
    found = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # gone meanwhile
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # state, ppid, ..., starttime (the 20th after the name)
        found[int(entry)] = (int(fields[1]), fields[19], fields[0], cmdline)
    return found


def session_of(cmd: str) -> str:
    """The --session-name=... of an nsys agent's command line, else ''."""
    return next((a.split("=", 1)[1] for a in cmd.split() if a.startswith("--session-name=")), "")


def run_and_its_agents(root: int, table: dict[int, Process]) -> dict[tuple[int, str], str]:
    """`root`'s descendants and the nsys agents named after one of them: (pid, start time) -> command line."""
    ours: set[int] = {root}
    while more := {pid for pid, p in table.items() if p[0] in ours} - ours:
        ours |= more
    agents = {
        pid
        for pid, p in table.items()
        if "--start-agent" in p[3] and any(session_of(p[3]).endswith(f"-{mine}") for mine in ours)
    }
    return {(pid, table[pid][1]): table[pid][3] for pid in ours | agents}


def still_running(seen: dict[tuple[int, str], str]) -> list[str]:
    table = processes()
    return [
        f"{pid} {cmd[:160]}"
        for (pid, started), cmd in seen.items()
        if pid in table and table[pid][1] == started and table[pid][2] != "Z"  # a zombie has exited
    ]


def wait_for(proc: subprocess.Popen, moment: str, seen: dict[tuple[int, str], str]) -> None:
    """Return at `moment` of the run ("agent": nsys's agent is up, before any rank; "capture": both ranks
    have run for 4 s, inside the capture), adding every process of the run to `seen` meanwhile."""
    deadline, since = time.monotonic() + 120, None
    while since is None or time.monotonic() < since + (4 if moment == "capture" else 0):
        assert proc.poll() is None and time.monotonic() < deadline, f"the run ended or never reached {moment}"
        seen |= run_and_its_agents(proc.pid, processes())
        alive = still_running(seen)
        ranks = sum("spawn_main" in c for c in alive)
        if since is None and any("--start-agent" in c for c in alive) and (ranks == 2 or moment == "agent"):
            since = time.monotonic()
        time.sleep(0.1)


@pytest.mark.parametrize("moment", ["agent", "capture"])
def test_sigint_to_the_process_group_leaves_no_process(tmp_path, moment):
    out = tmp_path / "traces"
    # Endless measured steps of the toy model: the run is still going when the interrupt comes.
    cmd = ["bash", str(REPO / "run_nsys.sh"), "overlap", "--gpus", "0", "-o", str(out), "--model", "toy"]
    cmd += ["--steps", "1000000", "--warmup", "1", "--timeout", "300"]
    token = owned.new_token(os.environ.get(owned.OWNER_ENV))
    proc = subprocess.Popen(
        [*AS_IN_A_TERMINAL, *cmd],
        cwd=REPO,
        env=owned.env_with(token),
        start_new_session=True,
        stderr=subprocess.PIPE,
        text=True,
    )
    seen: dict[tuple[int, str], str] = {}
    try:
        wait_for(proc, moment, seen)
        seen |= run_and_its_agents(proc.pid, processes())
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
        _, err = proc.communicate(timeout=60)
        deadline = time.monotonic() + 20
        while (left := still_running(seen) + owned.describe(owned.carrying(token))) and time.monotonic() < deadline:
            time.sleep(0.5)
    finally:  # whatever the outcome, leave nothing running on the machine
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        owned.end_all(token, wait_s=0)
        for line in still_running(seen):  # the agent, in case it does not carry the token
            with contextlib.suppress(OSError):
                os.kill(int(line.split()[0]), signal.SIGKILL)
    assert left == [], f"left running after the interrupt; the run said: {err[-3000:]}"
    nsys_pids = [pid for (pid, _), cmd in seen.items() if " profile " in cmd and "nsys" in cmd.split()[0]]
    assert nsys_pids and [p for p in nsys_pids if Path(f"/dev/shm/sem.nsys_sem_{p}").exists()] == []
    assert proc.returncode == 1 and "interrupted" in err and "Traceback" not in err, err[-2000:]
    assert list(out.iterdir()) == []  # no partial report either
