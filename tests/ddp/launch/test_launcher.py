"""The launcher: results from rank 0, threads per rank, and a failing rank stopping the job quickly."""

from __future__ import annotations

import os
import pickle
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ddp.launch.launcher import choose_backend, cpu_count, launch
from ddp.launch.rank_failures import GRACE_S, RankFailedError, collect
from tests.ddp import cases
from tests.support import owned

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.ranks  # spawns ranks
def test_spawned_ranks_report_their_context():
    info = launch(cases.report_context, 2, timeout_s=60)
    assert info["rank"] == 0 and info["world_size"] == 2 and info["backend"] == "gloo"
    assert info["device"] == "cpu"
    assert info["threads"] == max(1, cpu_count() // 2)  # ranks share the cores instead of oversubscribing


@pytest.mark.ranks  # spawns ranks
def test_rank_that_raises_stops_the_others_with_its_error():
    started = time.monotonic()
    with pytest.raises(RankFailedError, match=r"rank 1 failed: ValueError: boom on purpose"):
        launch(cases.raise_on_rank1, 2, timeout_s=60)
    assert time.monotonic() - started < 45  # well before the 60 s collective timeout


@pytest.mark.ranks  # spawns ranks
def test_rank_that_dies_silently_is_named():
    with pytest.raises(RankFailedError, match=r"rank 1 exited with code 3"):
        launch(cases.exit_on_rank1, 2, timeout_s=60)


@pytest.mark.ranks  # spawns ranks
def test_ranks_end_with_a_parent_killed_outright(tmp_path):
    """SIGKILL (what a stopped recording may send) gives the parent no chance to stop its ranks: they
    end by themselves, and with them the queue's resource tracker."""
    token = owned.new_token(os.environ.get(owned.OWNER_ENV))
    code = "import sys; from ddp.launch.launcher import launch; from tests.ddp import cases; "
    code += "launch(cases.sleep_forever, 2, sys.argv[1])"
    parent = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], cwd=REPO, env=owned.env_with(token))
    try:
        deadline = time.monotonic() + 120
        while len(list(tmp_path.glob("rank*"))) < 2:  # both ranks are in the worker
            assert parent.poll() is None and time.monotonic() < deadline, "the ranks never started"
            time.sleep(0.2)
        ranks = [p for p in owned.describe(owned.carrying(token)) if "spawn_main" in p]
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 15
        while (left := owned.describe(owned.carrying(token))) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert left == [], f"still running after their parent was killed: {left} (the ranks were {ranks})"
    finally:
        parent.kill()
        owned.end_all(token, wait_s=0)


@pytest.mark.ranks  # spawns ranks
def test_ranks_that_finished_first_do_not_fail_a_slower_rank_0():
    """Ranks 1 and 2 reported and exited (their reports read one per pass, so one looks silent for a
    moment); rank 0 finishes after the grace period. That is a success, not a failure."""

    class Rank:
        def __init__(self, exitcode):
            self.exitcode = exitcode

    procs = [Rank(None), Rank(0), Rank(0)]
    results = queue.Queue()
    for rank in (1, 2):
        results.put((rank, "ok", pickle.dumps(None)))

    def rank0_finishes():
        results.put((0, "ok", pickle.dumps("rank 0's result")))
        procs[0].exitcode = 0

    threading.Timer(GRACE_S * 1.5, rank0_finishes).start()
    assert collect(procs, results) == "rank 0's result"


def test_bad_world_size_and_backend_are_refused():
    with pytest.raises(ValueError, match="world size must be a positive integer"):
        launch(cases.report_context, 0)
    with pytest.raises(ValueError, match="unknown backend"):
        choose_backend(2, "mpi")


@pytest.mark.ranks  # a torchrun job
def test_joins_an_existing_torchrun_job(tmp_path):
    """With RANK/WORLD_SIZE/LOCAL_RANK set, the CLI runs in-process as that rank (here a 1-rank job)."""
    env = {
        **os.environ,
        "RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(_free_port()),
    }
    out = owned.run(
        [sys.executable, "-m", "ddp.verify", "--impl", "flat", "--steps", "2", "--format", "csv"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[1].startswith("flat,") and out.stdout.strip().endswith("PASS")


def _free_port() -> int:
    from ddp.launch.launcher import free_port

    return free_port()
