"""A collective that never completes ends the job within the timeout, naming the collective and the rank
(gloo on CPU, a short process-group timeout; one rank deliberately stalled)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest
import torch.multiprocessing as mp

from ddp.comm.inflight import Position
from ddp.launch import launcher, rank_failures
from ddp.launch.launcher import RankFailedError, launch
from tests.ddp.launch import stall_cases
from tests.support import owned

REPO = Path(__file__).resolve().parents[3]
TIMEOUT_S = 3.0


@pytest.mark.ranks  # spawns ranks that stall until a timeout
@pytest.mark.parametrize("impl, world, stalled", [("flat", 3, 2), ("overlap", 2, 1)])
def test_stalled_rank_is_named_with_the_collective_the_others_waited_in(impl, world, stalled):
    started = time.monotonic()
    with pytest.raises(RankFailedError) as err:
        launch(stall_cases.stall_at_step_1, world, impl, stalled, timeout_s=TIMEOUT_S)
    took = time.monotonic() - started
    msg = str(err.value)
    waiting = [r for r in range(world) if r != stalled]
    assert msg.startswith(f"rank {stalled} stalled: never reached collective #"), msg
    assert " comm:all_reduce:" in msg and "\n" not in msg
    who = f"rank {waiting[0]}" if len(waiting) == 1 else "ranks " + ", ".join(map(str, waiting))
    assert f"in which {who} waited until the process-group timeout (3 s)" in msg
    assert f"rank {stalled} was not in a collective (last: comm:all_reduce:" in msg
    # the backend's own words come along; gloo words its timeout either way, depending on which side noticed
    assert "Timed out" in msg or "timeout caused pair closure" in msg, msg
    if impl == "flat":
        assert "never reached collective #2 comm:all_reduce:flat" in msg  # step 0 made #1
    assert took < 60, took  # the stalled rank sleeps 600 s: the launcher stopped it


@pytest.mark.ranks  # spawns ranks that stall until a timeout
@pytest.mark.parametrize(
    "inside, expected",
    [
        (
            [0, 1],
            "collective #1 comm:all_reduce:never never completed: ranks 0, 1 waited in it past the "
            r"process-group timeout \(1 s\) and no rank failed \(rank 0 in comm:all_reduce:never \(collective #1\)",
        ),
        ([0], "rank 1 stalled: never reached collective #1 comm:all_reduce:never, in which rank 0 waited"),
    ],
)
def test_a_collective_no_backend_times_out_is_stopped_by_the_launcher(monkeypatch, inside, expected):
    monkeypatch.setattr(rank_failures, "watchdog_slack_s", lambda timeout_s: 1.0)
    started = time.monotonic()
    with pytest.raises(RankFailedError, match=expected) as err:
        launch(stall_cases.never_completes, 2, inside, timeout_s=1.0)
    assert "the ranks were stopped" in str(err.value)
    assert time.monotonic() - started < 45


def test_root_cause_picks_the_rank_behind_and_falls_back_to_the_earliest_error():
    timeout = "RuntimeError: [gloo] Timed out waiting 3000ms for recv operation to complete"
    positions = {
        0: Position(7, 7, "comm:all_reduce:fc1.weight", 1.0, "comm:all_reduce:fc3.bias"),
        1: Position(6, 0, "", 0.0, "comm:all_reduce:fc1.bias"),
        2: Position(7, 7, "comm:all_reduce:fc1.weight", 1.5, "comm:all_reduce:fc3.bias"),
    }
    errors = {0: (10.0, timeout, "tb0"), 2: (10.1, timeout, "tb2")}
    with pytest.raises(RankFailedError) as err:
        rank_failures.raise_root_cause(errors, {}, positions, set(), 3.0)
    assert str(err.value).startswith(
        "rank 1 stalled: never reached collective #7 comm:all_reduce:fc1.weight, in "
        "which ranks 0, 2 waited until the process-group timeout (3 s); rank 1 was "
        "not in a collective (last: comm:all_reduce:fc1.bias, #6); the ranks were stopped "
        f"(rank 0: {timeout})"
    )
    assert err.value.details == "tb0"
    # A rank that finished is not waited for; an error that is no timeout is reported as it is.
    with pytest.raises(RankFailedError, match=r"^rank 0 failed: RuntimeError: \[gloo\] Timed out"):
        rank_failures.raise_root_cause(errors, {}, positions, {1}, 3.0)
    outside = {0: Position(7, 0, "", 0.0, "comm:all_reduce:fc3.bias"), 1: positions[1], 2: positions[0]}
    with pytest.raises(
        RankFailedError,
        match=r"^rank 0 failed: RuntimeError: \[gloo\] Timed out waiting 3000ms for "
        r"recv operation to complete; still running when it timed out: rank 1 "
        r"not in a collective \(last: comm:all_reduce:fc1.bias, #6\)$",
    ):
        rank_failures.raise_root_cause({0: errors[0], 2: errors[2]}, {}, outside, set(), 3.0)
    with pytest.raises(RankFailedError, match=r"^rank 2 failed: ValueError: boom$"):
        rank_failures.raise_root_cause({2: (1.0, "ValueError: boom", "")}, {}, positions, set(), 3.0)
    # A rank killed by a signal (NCCL's watchdog aborts) is named with where it was.
    with pytest.raises(
        RankFailedError,
        match=r"^rank 0 was killed by signal 6 without reporting a result \(in "
        r"comm:all_reduce:fc1.weight \(collective #7\) for \d+ s\)",
    ):
        rank_failures.raise_root_cause({}, {0: -6}, positions, set(), 3.0)


def test_timeout_comes_from_the_environment():
    assert launcher.default_timeout_s({}) == launcher.DEFAULT_TIMEOUT_S
    assert launcher.default_timeout_s({"DDP_TIMEOUT_S": "2.5"}) == 2.5
    for bad in ("0", "-1", "soon"):
        with pytest.raises(ValueError, match=f"DDP_TIMEOUT_S='{bad}': must be a number of seconds > 0"):
            launcher.default_timeout_s({"DDP_TIMEOUT_S": bad})


@pytest.mark.ranks  # a torchrun job that stalls until a timeout
def test_under_torchrun_the_waiting_rank_names_its_collective():
    env = {**os.environ, "DDP_TIMEOUT_S": str(TIMEOUT_S), "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    started = time.monotonic()
    res = owned.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            "-m",
            "tests.ddp.launch.stall_cases",
            "flat",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=240,
    )
    assert res.returncode != 0
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("error: rank 0 failed:")]
    assert len(lines) == 1, res.stderr[-3000:]
    assert "Timed out" in lines[0] and "[in comm:all_reduce:flat (collective #2) for " in lines[0]
    assert time.monotonic() - started < 200


@pytest.mark.ranks  # spawns ranks that stall until a timeout
def test_stall_outside_our_collectives_still_names_the_rank_left_running():
    """PyTorch DDP's second step starts with its own broadcast (bucket rebuild), which ddp.comm.collectives does not
    see: the timeout is reported with the rank that neither failed nor finished."""
    with pytest.raises(RankFailedError) as err:
        launch(stall_cases.stall_at_step_1, 2, "torch", 1, timeout_s=TIMEOUT_S)
    msg = str(err.value)
    assert msg.startswith("rank 0 failed: RuntimeError:") and "Timed out" in msg, msg
    assert "still running when it timed out: rank 1 not in a collective (last: comm:all_reduce:bucket" in msg


@pytest.mark.ranks  # spawns two ranks, one of them late
def test_a_rank_that_starts_later_than_the_collective_timeout_still_joins():
    """Joining waits for every rank to start, which can take seconds on a loaded machine: a 1 s collective
    timeout must not fail a rank that starts 3 s after the other (it used to: DistStoreError)."""
    spawn = mp.get_context("spawn")
    results = spawn.Queue()
    port = launcher.free_port()
    procs = [spawn.Process(target=stall_cases.join_late, args=(r, port, 3.0, 1.0, results)) for r in range(2)]
    for p in procs:
        p.start()
    try:
        got = dict(results.get(timeout=120) for _ in procs)
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    assert got == {0: 1.0, 1: 1.0}, got
