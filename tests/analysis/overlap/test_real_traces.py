"""Real exports: the acceptance figures on the 2xH100 nsys 2026.2 trace, and our own traces when present."""

from pathlib import Path

import pytest

from analysis import analyze
from analysis.run.loaded_run import load_trace

DATA = Path(__file__).resolve().parents[3] / ".." / "shared" / "data"
H100 = DATA / "nsys2026_2xH100_torchrun.sqlite"
OWN_TRACES = sorted((Path(__file__).resolve().parents[3] / "traces").glob("*.sqlite"))


@pytest.mark.real  # a whole real H100 trace, end to end
@pytest.mark.skipif(not H100.exists(), reason="../shared/data/nsys2026_2xH100_torchrun.sqlite not present")
def test_h100_trace_matches_the_independent_computation():
    """Figures from an independent computation (plain Python over the kernel table), to 1 us."""
    result = analyze(H100)
    totals = result.totals.set_index("device")
    expected = {0: (144, 33, 17.172652, 253.690832), 1: (145, 33, 8.229100, 256.095624)}
    for device, (pid, n_comm, comm_ms, compute_ms) in expected.items():
        row = totals.loc[device]
        assert row["pid"] == pid
        assert row["comm_kernels"] == n_comm
        assert row["comm_ms"] == pytest.approx(comm_ms, abs=1e-3)
        assert row["compute_ms"] == pytest.approx(compute_ms, abs=1e-3)
        assert row["overlap_ms"] == 0 and row["overlap_pct"] == 0
    summary = result.summary.iloc[0]
    assert (summary["source"], summary["profiler"]) == ("kernels", "nsys 2026.2.1.210")


@pytest.mark.skipif(not H100.exists(), reason="../shared/data/nsys2026_2xH100_torchrun.sqlite not present")
def test_h100_trace_launches_and_nccl_ranges():
    trace = load_trace(H100)
    ops = trace.gpu_ops
    matched = (ops["launch_start"] >= 0).mean()
    assert matched > 0.99  # only work launched before the cut window lacks its runtime call
    launched_first = ops[ops["launch_start"] >= 0]
    assert (launched_first["launch_start"] <= launched_first["start"]).all()
    assert set(ops.loc[ops["is_comm"], "name"]) == {"ncclDevKernel_SendRecv"}


@pytest.mark.real  # every trace run_nsys.sh made, end to end
@pytest.mark.skipif(not OWN_TRACES, reason="no traces/*.sqlite made yet (run_nsys.sh)")
@pytest.mark.parametrize("path", OWN_TRACES, ids=[p.stem for p in OWN_TRACES])
def test_our_own_traces_have_steps_and_communication(path):
    result = analyze(path)
    assert len(result.totals) >= 1
    assert result.steps["step"].notna().all(), "our runner names every step"
    assert (result.totals["comm_ranges"] > 0).all() or (result.totals["comm_kernels"] > 0).all()
