"""The suite's own clean-up (tests/support/owned.py): every process a command started is ended, even one
started late, in a session of its own, whose parent has died."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from profiling import processes
from tests.support import owned

# A parent that, after a moment, starts a sleeper in a new session and dies: the sleeper is reparented to
# init, outside the parent's process group and session, and started after any look at the tree at launch.
LATE_ORPHAN = (
    "import subprocess, sys, time; time.sleep(0.5); "
    "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], start_new_session=True, "
    "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); "
    "print(p.pid, flush=True)"
)


@pytest.mark.subprocess  # starts processes
def test_a_late_orphan_in_a_session_of_its_own_is_found_by_its_token_and_ended():
    token = owned.new_token()
    done = subprocess.run(
        [sys.executable, "-c", LATE_ORPHAN], env=owned.env_with(token), capture_output=True, text=True, timeout=60
    )
    orphan = int(done.stdout)
    try:
        found = owned.carrying(token)
        assert [pid for pid, _ in found] == [orphan]  # the parent has exited; its child still runs
        assert owned.end_all(token, wait_s=0) == [f"{orphan} {sys.executable} -c import time; time.sleep(60)"]
        deadline = time.monotonic() + 5
        while processes.alive(found) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert processes.alive(found) == set() and owned.carrying(token) == set()
    finally:
        processes.stop(owned.carrying(token), grace_s=0)


@pytest.mark.subprocess  # starts processes
def test_run_ends_what_its_command_left_running():
    done = owned.run([sys.executable, "-c", LATE_ORPHAN], timeout=60, capture_output=True, text=True)
    assert _running(int(done.stdout)) is False  # run returned once the orphan was stopped


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2 :].split()[0] != "Z"


# A stand-in for an nsys run that hangs: it starts a launcher in a session of its own that holds the run's
# stdout open (as nsys's launcher and the profiled program do) and never ends.
HUNG_NSYS = (
    "import subprocess, sys, time; "
    "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], start_new_session=True); "
    "print('started', flush=True); time.sleep(120)"
)


@pytest.mark.subprocess  # starts processes
def test_a_hung_nsys_run_is_stopped_with_the_orphans_holding_its_pipes(tmp_path):
    """tests/nsys_cli.py: a run past its time returns None soon, and nothing it started still runs."""
    from tests import nsys_cli

    token = owned.new_token()
    os.environ[owned.OWNER_ENV], before = token, os.environ[owned.OWNER_ENV]
    try:
        started = time.monotonic()
        assert nsys_cli._run([sys.executable, "-c", HUNG_NSYS], tmp_path, timeout_s=2) is None
        assert time.monotonic() - started < 20  # not the launcher's 120 s
        assert owned.carrying(token, below=True) == set()
    finally:
        os.environ[owned.OWNER_ENV] = before
        owned.end_all(token, below=True, wait_s=0)
