"""ddp.comm.instrumented: the one call that times a collective, names it in NVTX with its payload and records it
in flight, in one process with handles the test completes (no process group)."""

from __future__ import annotations

import pytest
import torch

from ddp.comm import inflight, nvtx_ranges
from ddp.comm.completion_poll import CompletionPoll
from ddp.comm.instrumented import Instrumented, nbytes
from ddp.comm.timing import CommTimer


class Log:
    """Stands in for nvtx and records, in one list, the ranges and what the issued collective saw."""

    def __init__(self) -> None:
        self.events: list[tuple] = []
        self.names: dict[int, str] = {}

    def range(self, name, payload=None):
        log = self

        class Push:
            def __enter__(self):
                log.events.append(("push", name, payload))

            def __exit__(self, *exc):
                log.events.append(("pop", name))

        return Push()

    def start(self, name, payload=None):
        rid = len(self.names) + 1
        self.names[rid] = name
        self.events.append(("start", name, payload))
        return rid

    def end(self, rid):
        self.events.append(("end", self.names[rid]))

    def mark(self, text):
        self.events.append(("mark", text))


class Work:
    """An async handle with a future the test completes, or none (as gloo's reduce-scatter)."""

    def __init__(self, with_future: bool = True) -> None:
        self.future = torch.futures.Future() if with_future else None
        self.done = False

    def get_future(self):
        if self.future is None:
            raise RuntimeError("not implemented")
        return self.future

    def is_completed(self):
        return self.done

    def wait(self):
        self.done = True
        if self.future is not None and not self.future.done():
            self.future.set_result([torch.zeros(1)])
        return True


@pytest.fixture
def log():
    rec = Log()
    nvtx_ranges.record_with(rec)
    yield rec
    nvtx_ranges.record_with(None)


def issued(log: Log, work=None):
    """An `issue` function that logs where the collective ran (which range was open, what inflight said)."""

    def issue():
        log.events.append(("issue", inflight.position().open_name))
        return work

    return issue


def test_blocking_is_timed_and_tracked_inside_its_range_with_the_payload(log):
    timer = CommTimer(torch.device("cpu"))
    Instrumented(timer).blocking("comm:all_reduce:flat", 4096, issued(log))
    assert log.events == [
        ("push", "comm:all_reduce:flat", 4096),
        ("issue", "comm:all_reduce:flat"),  # recorded in flight while it runs
        ("pop", "comm:all_reduce:flat"),
    ]
    assert inflight.position().open_seq == 0
    timer.close_step()
    stats = timer.collect()
    assert (stats.num_ops, stats.bytes) == (1, 4096) and stats.in_flight_s > 0


def test_async_range_and_record_end_when_its_future_completes(log):
    timer, work = CommTimer(torch.device("cpu")), Work()
    flight = Instrumented(timer).start("comm:all_gather:fc1", 512, issued(log, work))
    assert log.events == [("start", "comm:all_gather:fc1", 512), ("issue", "comm:all_gather:fc1")]
    assert inflight.position().open_name == "comm:all_gather:fc1"
    work.future.set_result([torch.zeros(1)])  # completion: the range ends, the record closes, before any wait
    assert log.events[-1] == ("end", "comm:all_gather:fc1") and inflight.position().open_seq == 0
    flight.wait()
    timer.close_step()
    assert timer.collect().bytes == 512


def test_a_handle_without_a_future_ends_at_the_first_poll_or_its_wait(log):
    timer, poll = CommTimer(torch.device("cpu")), CompletionPoll()
    instrumented = Instrumented(timer, poll)
    first, second = Work(with_future=False), Work(with_future=False)
    a = instrumented.start("comm:reduce_scatter:a", 8, issued(log, first))
    b = instrumented.start("comm:reduce_scatter:b", 8, issued(log, second))
    first.done = True
    poll.poll()  # a is complete: its range ends here
    assert [e for e in log.events if e[0] == "end"] == [("end", "comm:reduce_scatter:a")]
    b.wait()  # b's ends at its wait (no poll saw it complete)
    a.wait()  # already ended: nothing twice
    assert [e for e in log.events if e[0] == "end"] == [
        ("end", "comm:reduce_scatter:a"),
        ("end", "comm:reduce_scatter:b"),
    ]
    assert inflight.position().open_seq == 0


def test_then_chains_the_completion_on_the_future_handed_back(log):
    timer, work = CommTimer(torch.device("cpu")), Work()
    flight = Instrumented(timer).start(
        "comm:all_reduce:bucket0", 64, issued(log, work), also="grad_sync", then=lambda fut: fut.value()[0] + 1
    )
    assert log.events[:2] == [("start", "comm:all_reduce:bucket0", 64), ("start", "grad_sync", None)]
    work.future.set_result([torch.ones(1)])
    assert flight.future.wait().item() == 2  # `then`'s result, what DDP gets back
    assert {e for e in log.events if e[0] == "end"} == {("end", "comm:all_reduce:bucket0"), ("end", "grad_sync")}


def test_a_collective_that_raises_stays_open_in_flight_under_its_name(log):
    def issue():
        raise RuntimeError("connection reset")

    with pytest.raises(RuntimeError):
        Instrumented(CommTimer(torch.device("cpu"))).blocking("comm:all_reduce:flat", 4, issue)
    position = inflight.position()
    assert position.open_name == "comm:all_reduce:flat"
    inflight.end(position.open_seq)  # leave the record clean for the other tests


def test_nbytes_counts_elements_times_their_size():
    assert nbytes(torch.empty(3, 5, dtype=torch.bfloat16)) == 3 * 5 * 2
