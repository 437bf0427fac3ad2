"""ddp.comm.inflight: the record of collectives in flight, its shared-memory mirror, and async handles."""

from __future__ import annotations

import multiprocessing.sharedctypes

import pytest
import torch

from ddp.comm import inflight
from ddp.comm.inflight import Position


class Work:
    """A Work-like handle with a future the test completes."""

    def __init__(self) -> None:
        self.future = torch.futures.Future()
        self.waited = False

    def get_future(self):
        return self.future

    def wait(self):
        self.waited = True
        return True


@pytest.fixture
def slot():
    s = multiprocessing.sharedctypes.RawArray(inflight.Slot, 1)[0]
    inflight.attach(s)
    yield s
    inflight.attach(None)


def test_oldest_open_collective_is_the_position_and_is_mirrored(slot):
    before = inflight.position().issued
    a = inflight.begin("comm:all_reduce:a")
    b = inflight.begin("comm:all_reduce:b")
    assert (a, b) == (before + 1, before + 2)
    for p in (inflight.position(), inflight.read(slot)):
        assert (p.issued, p.open_seq, p.open_name, p.last_name) == (b, a, "comm:all_reduce:a", "comm:all_reduce:b")
    inflight.end(a)
    assert inflight.read(slot).open_seq == b and inflight.read(slot).open_name == "comm:all_reduce:b"
    inflight.end(b)
    inflight.end(b)  # twice is fine
    p = inflight.read(slot)
    assert (p.open_seq, p.issued, p.last_name) == (0, b, "comm:all_reduce:b")
    assert p.describe() == f"not in a collective (last: comm:all_reduce:b, #{b})"


def test_async_handle_ends_on_wait_or_on_success_but_a_failure_stays_open(slot):
    ok_work, failed_work, waited_work = Work(), Work(), Work()
    ok = inflight.TrackedWork(ok_work, inflight.begin("comm:all_reduce:ok"))
    failed = inflight.TrackedWork(failed_work, inflight.begin("comm:all_reduce:failed"))
    waited = inflight.TrackedWork(waited_work, inflight.begin("comm:all_reduce:waited"))
    assert inflight.position().open_name == "comm:all_reduce:ok"
    ok_work.future.set_result(None)
    failed_work.future.set_exception(RuntimeError("Timed out waiting 3000ms"))
    assert waited.wait() is True and waited_work.waited
    assert ok.get_future() is ok_work.future  # everything else reaches the wrapped handle
    p = inflight.position()
    assert p.open_name == "comm:all_reduce:failed"  # for the error report
    inflight.end(p.open_seq)
    assert failed is not None and inflight.position().open_seq == 0


def test_describe_reads_like_the_error_messages():
    assert (
        Position(12, 12, "comm:all_reduce:flat", 100.0, "comm:all_reduce:flat").describe(now=103.2)
        == "in comm:all_reduce:flat (collective #12) for 3 s"
    )
    assert Position().describe() == "before its first collective"
    assert inflight.ranks_text([1]) == "rank 1" and inflight.ranks_text([0, 2]) == "ranks 0, 2"


def test_long_names_are_cut_to_the_slot(slot):
    seq = inflight.begin("comm:all_reduce:" + "x" * 500)
    assert len(inflight.read(slot).open_name) == inflight.NAME_BYTES - 1
    inflight.end(seq)
