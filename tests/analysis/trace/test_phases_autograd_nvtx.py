"""A GPU job recorded with `nsys profile --pytorch=autograd-nvtx` (or under emit_nvtx): no range of ours,
PyTorch's ops as NVTX ranges suffixed `, seq = N, op_id = M`, backward on the autograd thread. Steps,
forward, backward and optimizer come from those markers, and the per-step figures follow from them."""

from itertools import pairwise

import numpy as np
import pytest

from analysis.overlap.analyze import analyze_trace
from analysis.run.loaded_run import load_trace
from tests.support.synthetic import NsysWriter

MS = 1_000_000
MAIN, AUTOGRAD = 500, 501
STEPS = 3
PERIOD = 10 * MS
NCCL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL"


def at(offsets_ms, k):
    return (np.asarray(offsets_ms, dtype=float) * MS).astype(np.int64) + k * PERIOD


def write(path):
    """Per iteration k (times in ms from k*10): DDP forward [0.1, 3) with an aten op, two autograd ops
    [4, 5) and [5.5, 7) on the autograd thread, the optimizer [8, 9); kernels: forward [0.6, 2.5)
    launched at 0.5, backward [4.3, 5.2) and [6.1, 7.5) launched at 4.2 and 6 from the autograd thread,
    an NCCL all-reduce [6.6, 8.2) launched at 6.5 from it on stream 2, the optimizer's [8.3, 8.8) at 8.1."""
    w = NsysWriter(path, flavour="2026")
    w.process(MAIN, threads={MAIN: "python3", AUTOGRAD: "pt_autograd_0"})
    for k in range(STEPS):
        seq = f", seq = {k}, op_id = {10 * k}"
        w.nvtx(MAIN, MAIN, at([0.1, 0.2, 8], k), at([3, 1, 9], k),
               np.array([f"DistributedDataParallel.forward, op_id = {k}", "aten::linear" + seq,
                         "Optimizer.step#AdamW.step" + seq], dtype=object))  # fmt: skip
        w.nvtx(MAIN, AUTOGRAD, at([4, 5.5], k), at([5, 7], k),
               np.array([f"autograd::engine::evaluate_function: {op}" + seq for op in ("MmBackward0", "AddBackward0")],
                        dtype=object))  # fmt: skip
        w.kernels(MAIN, MAIN, 0, 1, at([0.6, 8.3], k), at([2.5, 8.8], k), "gemm", launch=at([0.5, 8.1], k))
        w.kernels(MAIN, AUTOGRAD, 0, 1, at([4.3, 6.1], k), at([5.2, 7.5], k), "gemm", launch=at([4.2, 6], k))
        w.kernels(MAIN, AUTOGRAD, 0, 2, at([6.6], k), at([8.2], k), NCCL, launch=at([6.5], k))
    return w.close()


def test_steps_and_phases_come_from_the_autograd_nvtx_ranges(tmp_path):
    trace = load_trace(write(tmp_path / "autograd_nvtx.sqlite"))
    result = analyze_trace(trace)
    assert result.summary["phases"].iloc[0] == (
        "steps from the starts of DistributedDataParallel.forward, forward from DistributedDataParallel.forward, "
        "backward from autograd::engine::evaluate_function ops, optimizer from Optimizer.step#AdamW.step"
    )
    steps = result.steps.set_index("step")
    assert list(steps.index) == list(range(STEPS))
    # plain arithmetic on the kernels written above, per step
    forward_start = [at([0.1], k)[0] for k in range(STEPS)]
    period = [(b - a) / MS for a, b in pairwise(forward_start)]
    last = (at([9], STEPS - 1)[0] - forward_start[-1]) / MS  # the last range of the process ends it
    assert steps["step_ms"].tolist() == pytest.approx([*period, last])
    backward_span = (7.5 - 4.3) * MS  # first to last end of the kernels launched inside the backward
    assert steps["backward_ms"].tolist() == pytest.approx([backward_span / MS] * STEPS)
    hidden = min(8.2, 7.5) - 6.6  # the all-reduce under the second backward kernel
    assert steps["backward_overlap_ms"].tolist() == pytest.approx([hidden] * STEPS)
    assert steps["comm_ms"].tolist() == pytest.approx([8.2 - 6.6] * STEPS)
    phases = result.by_op_phase.dropna(subset=["step"])
    assert set(phases["phase"]) == {"backward"}  # issued from the autograd thread inside the backward


def test_without_any_nvtx_the_autograd_threads_launches_are_the_backward(tmp_path):
    """The same job under plain `nsys profile -t cuda`: no NVTX at all, but nsys names the threads, and
    the kernels the autograd engine's thread (`pt_autograd_0`) launched are the backward pass."""
    w = NsysWriter(tmp_path / "no_nvtx.sqlite", flavour="2026")
    w.process(MAIN, threads={MAIN: "python3", AUTOGRAD: "pt_autograd_0"})
    for k in range(STEPS):
        w.kernels(MAIN, MAIN, 0, 1, at([0.6, 8.3], k), at([2.5, 8.8], k), "gemm", launch=at([0.5, 8.1], k))
        w.kernels(MAIN, AUTOGRAD, 0, 1, at([4.3, 6.1], k), at([5.2, 7.5], k), "gemm", launch=at([4.2, 6], k))
        w.kernels(MAIN, AUTOGRAD, 0, 2, at([6.6], k), at([8.2], k), NCCL, launch=at([6.5], k))
    trace = load_trace(w.close())
    result = analyze_trace(trace)
    assert result.summary["phases"].iloc[0] == (
        "no steps found, no forward found, backward from the launches of the autograd engine's thread "
        "(pt_autograd_N), no optimizer found"
    )
    backward = trace.nvtx[trace.nvtx["text"] == "backward"]
    # one range per iteration: from the autograd thread's first launch to just after its last
    assert list(zip(backward["start"], backward["end"], strict=True)) == [
        (at([4.2], k)[0], at([6.5], k)[0] + 1) for k in range(STEPS)
    ]
    total = result.totals.iloc[0]
    assert total["backward_overlap_ms"] == pytest.approx(STEPS * (min(8.2, 7.5) - 6.6))
    assert result.steps["step"].isna().all()  # no step marker: the whole capture is one window


@pytest.mark.real  # reads two real H100 exports
@pytest.mark.parametrize("impl", ["naive", "overlap"])
def test_on_real_h100_exports_stripped_of_nvtx_the_autograd_thread_finds_the_backward(gpu_trace, tmp_path, impl):
    """The real per-rank exports (our ranges, pt_autograd_0 named by nsys) with every NVTX row deleted:
    the kernels the autograd thread launched are the ones our `backward` ranges held, bar the one per
    step the main thread launches inside `backward` before the engine takes over."""
    import shutil
    import sqlite3

    from analysis.measure.phases import launched_inside

    original = gpu_trace(f"{impl}.rank0.sqlite")
    stripped = tmp_path / f"no_nvtx.{impl}.sqlite"
    shutil.copyfile(original, stripped)
    stripped.chmod(0o644)
    db = sqlite3.connect(stripped)
    db.execute("DELETE FROM NVTX_EVENTS")
    db.commit()
    db.close()

    def backward_compute(trace):
        ops = trace.gpu_ops
        compute = (ops["kind"].cat.codes.to_numpy() == 0) & ~ops["is_comm"].to_numpy()
        return launched_inside(ops, trace.nvtx[trace.nvtx["text"] == "backward"]) & compute

    ours, found = load_trace(original), load_trace(stripped)
    assert analyze_trace(found).summary["phases"].iloc[0].startswith("no steps found, no forward found, backward from")
    assert (ours.gpu_ops["start"].to_numpy() == found.gpu_ops["start"].to_numpy()).all()  # the same kernels
    truth, got = backward_compute(ours), backward_compute(found)
    steps = int((ours.nvtx["text"] == "backward").sum())
    assert truth.sum() > 10_000
    assert not (got & ~truth).any()  # nothing outside our backward ranges
    assert (truth & ~got).sum() <= steps
