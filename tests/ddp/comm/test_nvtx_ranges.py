"""The NVTX names each implementation emits (the contract analysis reads), and the no-op fallback."""

from __future__ import annotations

import threading

import pytest
import torch.distributed as dist

from contract import COMM_ISSUE_PREFIX, COMM_WAIT_PREFIX
from ddp.comm import nvtx_ranges
from ddp.launch.launcher import launch
from ddp.strategies import registry
from ddp.training.loop import make_optimizer, train_step
from tests.ddp import cases


class Recorder:
    """Stands in for nvtx: records push/pop names, start/end pairs and the thread that ended each."""

    def __init__(self):
        self.pushed: list[str] = []
        self.started: dict[int, str] = {}
        self.ended: dict[int, str] = {}
        self.payloads: list[tuple[str, int | None]] = []  # (name, payload) of every range, in order
        self.lock = threading.Lock()

    def range(self, name, cache=True, payload=None):
        self.pushed.append(name)
        self.payloads.append((name, payload))
        return nvtx_ranges._NULL

    def start(self, name, payload=None):
        with self.lock:
            rid = len(self.started) + 1
            self.started[rid] = name
            self.payloads.append((name, payload))
        return rid

    def end(self, rid):
        with self.lock:
            self.ended[rid] = threading.current_thread().name


@pytest.fixture
def recorder(monkeypatch):
    rec = Recorder()
    for name in ("range", "start", "end"):
        monkeypatch.setattr(nvtx_ranges, name, getattr(rec, name))
    return rec


EXPECTED_COMM = {
    "naive": {
        "comm:all_reduce:" + n for n in ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "fc3.weight", "fc3.bias")
    },
    "flat": {"comm:all_reduce:flat"},
    "overlap": {
        "comm:all_reduce:" + n for n in ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "fc3.weight", "fc3.bias")
    },
    "overlap_bucket": {"comm:all_reduce:bucket0", "comm:all_reduce:bucket1"},
    "torch": {"comm:all_reduce:bucket0"},
    "fsdp": set(),  # all-gathers and reduce-scatters, no all-reduce: the toy has only Linear layers
    "torch_fsdp": set(),  # reduce-scatters, no all-reduce; and on one rank FSDP2 communicates nothing
    "hsdp": set(),  # as fsdp: one rank is one replica, with nothing to all-reduce across
    "torch_hsdp": set(),
}
ASYNC = {"overlap", "overlap_bucket", "torch"}


@pytest.mark.parametrize("impl", list(registry.IMPLEMENTATIONS))
def test_step_emits_contract_names(one_rank_group, recorder, impl):
    model = registry.wrap(impl, cases.build("toy", 0), bucket_size_mb=5000 / 2**20)
    assert recorder.pushed == ["comm:broadcast:params"]
    opt = make_optimizer("sgd", model.module.parameters(), 0.1)
    train_step(model, opt, cases.batch(0, 4), step=7)
    waits = [n for n in recorder.pushed if n.startswith(COMM_WAIT_PREFIX)]
    issues = [n for n in recorder.pushed if n.startswith(COMM_ISSUE_PREFIX)]
    phases = [n for n in recorder.pushed if not n.startswith((COMM_WAIT_PREFIX, COMM_ISSUE_PREFIX))]
    assert phases[1:5] == ["step 7", "forward", "backward", "grad_sync"]
    assert phases[-1] == "optimizer"
    comm = set(recorder.pushed) | set(recorder.started.values())
    # fsdp marks its waits for each unit's all-gather (forward and backward) and, when every gradient buffer
    # is taken, for the oldest reduce-scatter; each names a collective it issued
    waited = {"comm:" + w[len(COMM_WAIT_PREFIX) :] for w in waits}
    # (a wait range names the collective without its group: hsdp's `comm:all_gather:fc1@shard` is waited for
    # in `comm_wait:all_gather:fc1`)
    gathers = {n.split("@")[0] for n in comm if n.startswith("comm:all_gather:")}
    scatters = {n.split("@")[0] for n in comm if n.startswith("comm:reduce_scatter:")}
    if impl in ("fsdp", "hsdp"):
        assert gathers and gathers <= waited and waited <= gathers | scatters
    else:
        assert waited == set()
    assert {n for n in comm if n.startswith("comm:all_reduce:")} == EXPECTED_COMM[impl]
    # the bucketed strategies mark the host work that issues each bucket's all-reduce, once per bucket
    issued = {"comm:" + n[len(COMM_ISSUE_PREFIX) :] for n in issues}
    assert (issued, len(issues)) == (
        (EXPECTED_COMM[impl], len(issued)) if impl in ("overlap_bucket", "torch") else (set(), 0)
    )
    if impl in ASYNC:  # start/end ranges, each closed exactly once
        assert recorder.started and not any(n.startswith("comm:all_reduce") for n in recorder.pushed)
        dist.barrier()  # lets completion callbacks on the comm thread finish
        assert recorder.ended.keys() == recorder.started.keys()
    # DDP waits for its buckets inside backward: that wait is one start/end `grad_sync` range
    assert list(recorder.started.values()).count("grad_sync") == (1 if impl == "torch" else 0)


@pytest.mark.ranks  # spawns ranks
def test_async_ranges_end_on_the_comm_thread():
    """On CPU an async range ends in the future's callback: at completion, on the comm thread."""
    ended = launch(cases.async_range_end_threads, 2, timeout_s=60)
    main = ended.pop("main")
    assert len(ended) == 21  # one per parameter of the tiny LM, every range closed
    # The LM head's 5 MiB all-reduce is in flight long after the callback is attached.
    assert ended["comm:all_reduce:lm_head.weight"] != main


def test_fallback_is_a_noop_without_nvtx(monkeypatch):
    monkeypatch.setattr(nvtx_ranges, "_nvtx", None)
    with nvtx_ranges.range("anything"):
        pass
    rid = nvtx_ranges.start("x")
    nvtx_ranges.end(rid)
    nvtx_ranges.mark("y")
    assert rid is None


def test_real_nvtx_calls_accept_every_kind_of_range():
    with nvtx_ranges.range("test range"):
        rid = nvtx_ranges.start("test start")
        nvtx_ranges.end(rid)
        nvtx_ranges.mark("test mark")
    assert nvtx_ranges.range("test range") is nvtx_ranges.range("test range")  # cached per name


def test_uncached_names_do_not_grow_the_cache_and_disable_turns_everything_off(monkeypatch):
    monkeypatch.setattr(nvtx_ranges, "_nvtx", nvtx_ranges._nvtx)  # restored after the test
    monkeypatch.setattr(nvtx_ranges, "AVAILABLE", nvtx_ranges.AVAILABLE)
    before = len(nvtx_ranges._CACHE)
    for step in range(5):
        with nvtx_ranges.range(f"step {step}", cache=False):
            pass
    assert len(nvtx_ranges._CACHE) == before
    nvtx_ranges.disable()
    assert not nvtx_ranges.AVAILABLE and nvtx_ranges.range("forward") is nvtx_ranges._NULL
    assert nvtx_ranges.start("comm:all_reduce:x") is None


@pytest.mark.parametrize("impl", registry.REPLICATED)  # sharded ones: tests/ddp/strategies/test_torch_fsdp.py
def test_comm_ranges_carry_their_byte_count_as_payload(one_rank_group, recorder, impl):
    module = cases.build("buffered", 0)
    model = registry.wrap(impl, module, bucket_size_mb=600 / 2**20)
    everything = [*module.parameters(), *module.buffers()]
    assert recorder.payloads == [("comm:broadcast:params", sum(t.numel() * 4 for t in everything))]
    opt = make_optimizer("sgd", model.module.parameters(), 0.1)
    for step in range(2):  # the second step runs the rebuilt buckets
        del recorder.payloads[:]
        train_step(model, opt, cases.batch(step, 4), step=step)
        dist.barrier()
    layout = {entry["name"]: entry["bytes"] for entry in model.comm_layout()}
    sent = [(n.removeprefix("comm:all_reduce:"), b) for n, b in recorder.payloads if n.startswith("comm:all_reduce:")]
    assert sorted(sent) == sorted(layout.items())  # each collective once, its payload its bytes
    params = sum(p.numel() * 4 for p in module.parameters())
    assert sum(layout.values()) == params + (0 if impl == "torch" else 4 * len(list(module.parameters())))
