"""analysis.advise on synthetic two-rank GPU (NCCL kernel) runs of PyTorch DDP whose answer is worked out
by hand: the slowdown and the per-call wait measured from the kernels, and the step at another size.

Four parameters in arrival order, 2, 1, 0.5 and 0.25 MiB, recorded at 0.25 MiB (one bucket each). Per
rank and step: a forward kernel, then backward's four `gemm` kernels of W each; each gradient is ready
at the end of its kernel, and its all-reduce kernel costs LATENCY + bytes * NS_PER_BYTE. `stalled`:
compute waits while the all-reduce runs (the next gemm starts at its end; slowdown 1); otherwise the
all-reduce runs beside the next gemm (slowdown 0). Both ranks are identical (no wait for each other).
"""

from __future__ import annotations

import numpy as np
import pytest

from analysis.advise.advice import advise
from contract import ALL_REDUCE, BACKWARD, FORWARD, OPTIMIZER, comm_range, step_range
from tests.support.synthetic import PUSH_POP, START_END, NsysWriter

US, MIB = 1_000, 2**20
W, FWD, OPT = 300 * US, 200 * US, 50 * US
LATENCY, NS_PER_BYTE = 20 * US, 0.05  # 20 us + 20 GB/s
PARAMS = [("head", 2 * MIB), ("b2", MIB), ("b1", MIB // 2), ("emb", MIB // 4)]
STEPS = 3


def cost(nbytes: float) -> float:
    return LATENCY + nbytes * NS_PER_BYTE


def write_run(path, stalled: bool):
    """The module docstring's run, steps back to back."""
    w = NsysWriter(path, flavour="2026")
    meta = {
        "implementation": "torch",
        "world_size": 2,
        "backend": "nccl",
        "bucket_mb": 0.25,
        "param_bytes": dict(PARAMS),
        "buckets": [{"name": f"bucket{k}", "params": [n], "bytes": b} for k, (n, b) in enumerate(PARAMS)],
    }
    for rank, pid in enumerate((101, 102)):
        w.process(pid)
        w.meta_mark(pid, pid, 10, rank=rank, **meta)
        t0 = US
        for s in range(STEPS):  # back to back: every step the same
            b0 = t0 + FWD
            gemm, calls, t = [], [], b0
            for k, (_, nbytes) in enumerate(PARAMS):  # one pass per parameter (four)
                gemm.append((t, t + W))
                ready = t + W
                calls.append((ready, ready + int(cost(nbytes))))
                t = calls[-1][1] if stalled and k < len(PARAMS) - 1 else ready
            b1, comm_end = gemm[-1][1], calls[-1][1]
            end = comm_end + OPT
            w.nvtx(pid, pid, t0 - 2, end + 2, step_range(s), kind=PUSH_POP)
            w.nvtx(pid, pid, t0 - 1, b0 - 1, FORWARD, kind=PUSH_POP)
            w.nvtx(pid, pid, b0 - 1, b1, BACKWARD, kind=PUSH_POP)
            w.nvtx(pid, pid, comm_end, end + 1, OPTIMIZER, kind=PUSH_POP)
            w.kernels(pid, pid, rank, 7, np.array([t0]), np.array([b0 - 10]), "fwd", launch=np.array([t0 - 1]))
            gs, ge = np.array(gemm).T
            w.kernels(pid, pid, rank, 7, gs, ge, "gemm", launch=gs - 1)
            cs, ce = np.array(calls).T
            w.kernels(pid, pid, rank, 20, cs, ce, "ncclDevKernel_AllReduce_Sum_f32_RING_LL", launch=cs - 2)
            tags = np.array([comm_range(ALL_REDUCE, f"bucket{k}") for k in range(4)], dtype=object)
            w.nvtx(pid, pid, cs - 3, ce + 1, tags, kind=START_END, payload=np.array([b for _, b in PARAMS]))
            w.kernels(pid, pid, rank, 7, np.array([comm_end]), np.array([end]), "sgd", launch=np.array([comm_end]))
            t0 = end + 4
    w.close()


@pytest.fixture(scope="module", params=[True, False], ids=["stalled", "beside"])
def run(request, tmp_path_factory):
    path = tmp_path_factory.mktemp("advise_gpu") / "torch.sqlite"
    write_run(path, request.param)
    return request.param, path


def test_the_kernels_give_the_slowdown_the_cost_and_no_wait(run):
    stalled, path = run
    (result,) = advise([path], [0.25])
    assert result.model == "stalls"
    assert result.slowdown == pytest.approx(1.0 if stalled else 0.0, abs=1e-9)
    assert result.call_wait_ms == 0.0
    assert result.cost.overall.latency_ns == pytest.approx(LATENCY, rel=1e-3)
    assert result.cost.overall.ns_per_byte == pytest.approx(NS_PER_BYTE, rel=1e-3)
    (own,) = result.candidates  # the recorded layout reproduces the recorded step and exposed communication
    assert own.predicted_step_ms == pytest.approx(result.measured_step_ms, abs=1e-5)
    assert own.predicted_exposed_comm_ms == pytest.approx(result.measured_exposed_comm_ms, abs=1e-5)
    assert own.predicted_step_ms_err == pytest.approx(0.0, abs=1e-9)  # identical steps: no spread


def test_interference_makes_small_buckets_worse_and_a_tail_makes_large_ones_worse(run):
    stalled, path = run
    (result,) = advise([path], [0.25, 100.0])
    small, large = result.candidates
    # 100 MiB: `head` alone in DDP's 1 MiB first bucket, then one bucket of the other three (1.75 MiB),
    # ready when backward's work is done: 2 calls instead of 4
    assert (small.buckets, large.buckets) == (4, 2)
    rest = (MIB + MIB // 2 + MIB // 4) * NS_PER_BYTE
    if stalled:
        # compute stops under each call: two fewer calls under backward save their transfers (b2, b1),
        # the tail grows from emb's call to the 1.75 MiB one: net two latencies saved
        change = -(cost(MIB) + cost(MIB // 2) + cost(MIB // 4)) + (LATENCY + rest)
        assert change == pytest.approx(-2 * LATENCY)
    else:
        # the calls hide beside compute: only the tail changes, emb's call -> the 1.75 MiB one
        change = (LATENCY + rest) - cost(MIB // 4)
    assert large.predicted_step_ms - small.predicted_step_ms == pytest.approx(change / 1e6, abs=1e-6)
    assert result.recommended_bucket_mb == (100.0 if stalled else 0.25)
    assert result.recommendation is not None and result.recommendation.kept is (not stalled)
