"""Communication timing (ddp.comm.timing): the interval arithmetic, the host clock on CPU, and the
CUDA path with stand-in events, which must never wait on the host per collective."""

from __future__ import annotations

import contextlib

import pytest
import torch
from hypothesis import given, strategies as st

from ddp.comm import nvtx_ranges, timing as comm_timing
from ddp.comm.timing import CommTimer, union_and_part_before
from ddp.strategies import base, registry
from ddp.training.loop import make_optimizer, train_step
from tests.ddp import cases
from tests.ddp.comm.test_nvtx_ranges import Recorder

# On one rank FSDP2 communicates nothing: the sharded strategies' timing is tested on 2 ranks
# (tests/ddp/strategies/test_torch_fsdp.py).
IMPLS = list(registry.REPLICATED)
TOY_PARAMS = 6  # fc1..fc3, weight and bias
TOY_GRAD_BYTES = 4 * (16 * 32 + 32 + 32 * 32 + 32 + 32 * 4 + 4)


# ---- interval arithmetic -------------------------------------------------------------------------
@given(st.lists(st.tuples(st.integers(0, 30), st.integers(0, 10)), max_size=12), st.integers(-2, 42))
def test_union_and_part_before_match_counting_unit_cells(raw, cut):
    intervals = [(float(s), float(s + d)) for s, d in raw]
    covered = {c for s, e in intervals for c in range(int(s), int(e))}  # cell c is [c, c+1)
    total, before = union_and_part_before(intervals, float(cut))
    assert total == len(covered)
    assert before == len({c for c in covered if c + 1 <= cut})


# ---- CPU: host clocks -----------------------------------------------------------------------------
def _steps(model, n, collect=True):
    opt = make_optimizer("sgd", model.module.parameters(), 0.1)
    stats = []
    for step in range(n):
        train_step(model, opt, cases.batch(step, 4), step)
        if collect:
            stats.append(model.reset_comm_stats())
    return stats


@pytest.mark.parametrize("impl", IMPLS)
def test_cpu_stats_count_each_collective_and_its_bytes(one_rank_group, impl):
    model = registry.wrap(impl, cases.build("toy", 0), bucket_size_mb=600 / 2**20)
    for stats in _steps(model, 3)[1:]:  # after the first step (buckets rebuilt)
        assert stats.clock == "host"
        assert (
            stats.num_ops == len(model.comm_layout()) == {"naive": 6, "overlap": 6, "flat": 1}.get(impl, stats.num_ops)
        )
        assert stats.bytes == sum(e["bytes"] for e in model.comm_layout())
        assert stats.bytes == TOY_GRAD_BYTES + (0 if impl == "torch" else 4 * TOY_PARAMS)
        assert 0 <= stats.hidden_s <= stats.in_flight_s and stats.in_flight_s > 0
        assert stats.comm_time_s == pytest.approx(stats.in_flight_s - stats.hidden_s)
    if impl in ("naive", "flat"):  # they communicate after backward: nothing hidden
        assert stats.hidden_s == 0 and stats.overlap == 0


def test_cpu_uncollected_steps_are_folded_and_kept_bounded(one_rank_group):
    model = registry.wrap("naive", cases.build("toy", 0))
    _steps(model, comm_timing.MAX_UNCOLLECTED_STEPS + 2, collect=False)
    # slots are reused once folded: at most MAX_UNCOLLECTED_STEPS steps' worth, not one per collective ever
    assert len(model.comm._starts) == TOY_PARAMS * comm_timing.MAX_UNCOLLECTED_STEPS
    stats = model.reset_comm_stats()
    assert stats.num_ops == TOY_PARAMS * (comm_timing.MAX_UNCOLLECTED_STEPS + 2)


# ---- CUDA path, with stand-ins for events and streams ---------------------------------------------
class FakeCuda:
    """Stand-ins for torch.cuda's Event/Stream/stream/current_stream/synchronize that count every
    host wait. Each record() takes the next tick of a fake device clock (ms), unless `now` is set."""

    def __init__(self):
        self.host_waits: list[str] = []
        self.tick = 0.0
        self.now: float | None = None
        fake = self

        class Event:
            def __init__(self, enable_timing=False, **_):
                self.time = None

            def record(self, stream=None):
                fake.tick += 1.0
                self.time = fake.tick if fake.now is None else fake.now

            def elapsed_time(self, end):
                assert self.time is not None and end.time is not None, "reading an event never recorded"
                return end.time - self.time

            def synchronize(self):
                fake.host_waits.append("Event.synchronize")

            def query(self):
                fake.host_waits.append("Event.query")
                return True

        class Stream:
            def __init__(self, device=None, **_):
                pass

            def wait_stream(self, other):
                pass

            def synchronize(self):
                fake.host_waits.append("Stream.synchronize")

        self.Event, self.Stream = Event, Stream

    def install(self, monkeypatch):
        monkeypatch.setattr(torch.cuda, "Event", self.Event)
        monkeypatch.setattr(torch.cuda, "Stream", self.Stream)
        monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
        monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: self.Stream())
        monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: self.host_waits.append("synchronize"))
        monkeypatch.setattr(base, "synchronize_device", lambda t: self.host_waits.append("synchronize_device"))


@pytest.fixture
def fake_cuda(monkeypatch):
    fake = FakeCuda()
    fake.install(monkeypatch)
    return fake


def _on_fake_cuda(model):
    model.comm = CommTimer(torch.device("cuda", 0))  # the wrapper's timer as it is on a GPU
    return model


@pytest.mark.parametrize("impl", IMPLS)
def test_cuda_steps_never_wait_on_the_host_and_each_collect_waits_once(one_rank_group, fake_cuda, impl):
    """The bug this guards against: a torch.cuda.synchronize (or event wait) per collective, which
    serialises the host behind every NCCL call. A step may wait nowhere; collecting waits once."""
    model = _on_fake_cuda(registry.wrap(impl, cases.build("toy", 0), bucket_size_mb=600 / 2**20))
    opt = make_optimizer("sgd", model.module.parameters(), 0.1)
    for step in range(4):
        train_step(model, opt, cases.batch(step, 4), step)
        assert fake_cuda.host_waits == [], f"step {step} waited on the host: {fake_cuda.host_waits}"
        stats = model.reset_comm_stats()
        assert fake_cuda.host_waits == ["Event.synchronize"]
        fake_cuda.host_waits.clear()
        assert stats.clock == "cuda_events" and stats.num_ops >= 1
        assert stats.num_ops == (TOY_PARAMS if impl in ("naive", "overlap") else stats.num_ops)
        assert stats.bytes == TOY_GRAD_BYTES + (0 if impl == "torch" else 4 * TOY_PARAMS)
        assert stats.in_flight_s > 0 and 0 <= stats.hidden_s <= stats.in_flight_s


@pytest.mark.parametrize("impl", ["overlap", "overlap_bucket", "torch"])
def test_cuda_async_ranges_end_when_the_step_is_collected(one_rank_group, fake_cuda, monkeypatch, impl):
    """CUDA futures complete at enqueue: the `comm:` ranges stay open until the host has seen the
    step complete (collect), where on CPU they end at completion, before the step is over."""
    rec = Recorder()
    for name in ("range", "start", "end"):
        monkeypatch.setattr(nvtx_ranges, name, getattr(rec, name))
    model = _on_fake_cuda(registry.wrap(impl, cases.build("toy", 0)))
    opt = make_optimizer("sgd", model.module.parameters(), 0.1)
    train_step(model, opt, cases.batch(0, 4), 0)
    comm = {rid for rid, name in rec.started.items() if name.startswith("comm:")}
    assert comm and not comm & rec.ended.keys()
    model.reset_comm_stats()
    assert set(rec.started) <= set(rec.ended)  # every comm range, and torch's grad_sync, closed now


def test_cuda_intervals_come_from_the_events(fake_cuda):
    """Two async collectives: [0, 3] and [2, 8] ms on the device, backward ending at 5 ms."""
    timer = CommTimer(torch.device("cuda", 0))

    class Work:
        def wait(self):
            return True

    def at(ms, action, *args):
        fake_cuda.now = ms
        return action(*args)

    first = at(0.0, timer.begin, 100)
    second = at(2.0, timer.begin, 50)
    at(5.0, timer.backward_ended)
    at(3.0, timer.wait, first, Work())
    at(8.0, timer.wait, second, Work())
    timer.close_step()
    stats = timer.collect()
    assert stats.num_ops == 2 and stats.bytes == 150
    assert stats.in_flight_s == pytest.approx(8e-3)
    assert stats.hidden_s == pytest.approx(5e-3)
    assert stats.comm_time_s == pytest.approx(3e-3) and stats.overlap == pytest.approx(5 / 8)
    assert fake_cuda.host_waits == ["Event.synchronize"]


def test_collect_in_the_middle_of_a_step_keeps_that_steps_collectives(fake_cuda):
    """Collected while a step's collectives are in flight: the closed step is folded, the open one
    keeps its (distinct) events and is folded with its own backward end at the next collect."""
    timer = CommTimer(torch.device("cuda", 0))

    class Work:
        def wait(self):
            return True

    def at(ms, action, *args):
        fake_cuda.now = ms
        return action(*args)

    slots = [at(t, timer.begin, 10) for t in (0.0, 1.0)]
    at(2.0, timer.backward_ended)
    for slot, t in zip(slots, (3.0, 4.0), strict=True):
        at(t, timer.wait, slot, Work())
    timer.close_step()  # step 1: [0, 4] in flight, backward ends at 2
    opened = [at(t, timer.begin, 20) for t in (10.0, 11.0, 12.0)]  # step 2 issues 3 during backward
    first = timer.collect()
    assert (first.num_ops, first.bytes) == (2, 20)
    assert first.in_flight_s == pytest.approx(4e-3) and first.hidden_s == pytest.approx(2e-3)
    assert len({id(e) for e in timer._starts}) == len(timer._starts)  # no event shared by two slots
    at(13.0, timer.backward_ended)
    for slot, t in zip(range(3), (14.0, 15.0, 16.0), strict=True):  # the open step's slots now come first
        at(t, timer.wait, slot, Work())
    timer.close_step()
    second = timer.collect()
    assert len(opened) == 3 and (second.num_ops, second.bytes) == (3, 60)
    assert second.in_flight_s == pytest.approx(6e-3) and second.hidden_s == pytest.approx(3e-3)
