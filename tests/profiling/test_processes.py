"""profiling.processes: what a stopped run started is found and stopped, an nsys agent by its session name."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from profiling import processes

SLEEPER = [sys.executable, "-c", "import sys, time; time.sleep(float(sys.argv[1]))"]


def test_agent_session_is_read_from_the_agents_command_line_only():
    agent = ["/x/nsys", "--start-agent", "--session-name=profile-python-42", "--shm-name=quadd-1"]
    assert processes.agent_session(agent) == "profile-python-42"
    assert processes.agent_session(["/x/nsys", "profile", "--session-name=profile-python-42"]) is None


@pytest.mark.subprocess  # spawns processes
def test_an_agent_named_after_a_finished_run_is_stopped_and_others_are_not():
    done = subprocess.Popen([*SLEEPER, "0"])
    done.wait()
    ours = subprocess.Popen([*SLEEPER, "60", "--start-agent", f"--session-name=profile-python-{done.pid}"])
    other = subprocess.Popen([*SLEEPER, "60", "--start-agent", f"--session-name=profile-python-{done.pid}0"])
    try:
        time.sleep(0.5)  # both running
        assert processes.stop_leftovers(set(), done.pid, grace_s=5) == set()
        assert ours.wait(timeout=5) == -15  # SIGTERM
        assert other.poll() is None
    finally:
        ours.kill(), other.kill()


@pytest.mark.subprocess  # spawns processes
def test_descendants_in_a_session_of_their_own_are_found_while_the_parent_runs_and_stopped_after():
    # A parent that starts a child in a new session, as nsys-launcher starts the profiled program.
    code = "import subprocess, sys, time; subprocess.Popen(sys.argv[1:], start_new_session=True); time.sleep(60)"
    parent = subprocess.Popen([sys.executable, "-c", code, *SLEEPER, "60"])
    tree: set[processes.Key] = set()
    try:
        deadline = time.monotonic() + 30
        while not (tree := processes.run_tree(parent.pid)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(tree) == 1
        parent.kill()
        parent.wait()
        assert processes.alive(tree) == tree  # orphaned, still running
        assert processes.stop_leftovers(tree, parent.pid, grace_s=5) == set()
        assert processes.alive(tree) == set()
    finally:
        parent.kill()
        processes.stop(tree, grace_s=0)
