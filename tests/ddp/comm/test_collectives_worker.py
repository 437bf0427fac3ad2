"""ddp.comm.p2p_work: jobs run one at a time in submission order on one thread; errors reach the waiter."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from ddp.comm.p2p_work import run_in_order


def test_jobs_run_in_submission_order_on_one_thread() -> None:
    log: list[tuple[int, str]] = []

    def job(i: int, delay: float):
        def run():
            time.sleep(delay)  # a slow early job must still finish before later ones start
            log.append((i, threading.current_thread().name))
            return torch.tensor([i])

        return run

    handles = [run_in_order(job(i, 0.02 if i == 0 else 0.0), async_op=True) for i in range(3)]
    blocking = run_in_order(job(3, 0.0))  # queues behind the async ones
    assert int(blocking) == 3
    assert [int(h.result()) for h in handles] == [0, 1, 2]
    assert [i for i, _ in log] == [0, 1, 2, 3]
    assert {name for _, name in log} == {"p2p-collectives"}
    assert all(h.is_completed() for h in handles)


def test_a_failing_job_raises_at_wait_and_later_jobs_still_run() -> None:
    def boom():
        raise ValueError("boom")

    handle = run_in_order(boom, async_op=True)
    with pytest.raises(ValueError, match="boom"):
        handle.wait()
    with pytest.raises(ValueError, match="boom"):
        run_in_order(boom)
    assert int(run_in_order(lambda: torch.tensor([7]))) == 7


def test_a_call_from_the_worker_thread_runs_inline_instead_of_deadlocking() -> None:
    inner = run_in_order(lambda: run_in_order(lambda: torch.tensor([5])) + 1, async_op=True)
    done = threading.Event()
    inner.get_future().then(lambda _: done.set())
    assert done.wait(timeout=10), "nested call deadlocked"
    assert int(inner.result()) == 6
