"""Phases of someone else's job: a plain PyTorch DDP script (tests/support/plain_ddp.py, none of this
project's code) recorded here with plain torch.profiler and with plain `nsys profile`.

The steps and backward windows the analysis finds are checked against the script's own timer (host
clock, the clock both profilers' timestamps are on) and against the markers counted in plain Python from
the raw JSON."""

from __future__ import annotations

import json
import shutil
from decimal import Decimal
from pathlib import Path

import pytest

from analysis.overlap import command as overlap
from analysis.overlap.analyze import analyze_trace
from analysis.run.loaded_run import load_trace
from analysis.trace.phase_markers import phases_of
from tests.analysis.run.test_runs_identity import merge, one_line, recording
from tests.support.recordings import PLAIN_DDP_STEPS as STEPS

pytestmark = [pytest.mark.ranks, pytest.mark.nsys]  # the session's two-rank job, under nsys where installed

ROOT = Path(__file__).resolve().parents[2]
EXPECTED = (
    "steps from ProfilerStep#N, forward from DistributedDataParallel.forward, backward from "
    "autograd::engine::evaluate_function ops, optimizer from Optimizer.step#SGD.step"
)


@pytest.fixture(scope="module")
def recorded(plain_ddp_run) -> Path:
    return plain_ddp_run  # the job's STEPS steps, the first torch.profiler's warm-up


def raw_events(path: Path) -> tuple[int, list[dict]]:
    """(baseTimeNanoseconds, the complete events) as the file holds them."""
    doc = json.loads(path.read_text())
    return int(doc.get("baseTimeNanoseconds", 0)), [e for e in doc["traceEvents"] if e.get("ph") == "X"]


def ns(us) -> int:
    """A Kineto time (µs, as written) in ns, exactly."""
    return int(Decimal(str(us)) * 1000)


def plain_windows(path: Path) -> dict[int, dict]:
    """Per ProfilerStep#N, counted from the raw JSON: its [start, end) and the span of the autograd
    engine's ops that start inside it, in absolute ns (base + ts)."""
    base, events = raw_events(path)
    steps = {
        int(e["name"].split("#")[1]): (base + ns(e["ts"]), base + ns(e["ts"]) + ns(e["dur"]))
        for e in events
        if e["name"].startswith("ProfilerStep#")
    }
    out = {}
    for n, (lo, hi) in steps.items():
        ops = [
            (base + ns(e["ts"]), base + ns(e["ts"]) + ns(e["dur"]))
            for e in events
            if e["name"].startswith("autograd::engine::evaluate_function: ") and lo <= base + ns(e["ts"]) < hi
        ]
        out[n] = {"step": (lo, hi), "backward": (min(s for s, _ in ops), max(e for _, e in ops)), "ops": len(ops)}
    return out


def test_torch_profiler_phases_are_pytorchs_own_markers(recorded):
    files = sorted(recorded.glob("plain_ddp.rank*.json"))
    assert len(files) == 2
    trace = load_trace(files)
    assert phases_of(trace) == EXPECTED
    result = analyze_trace(trace)
    assert result.summary["phases"].iloc[0] == EXPECTED
    # DDP's gradient all-reduces are issued in the backward found from the autograd ops, or after it
    ops = result.by_op_phase
    assert set(ops.loc[ops["op"] == "all_reduce", "phase"]) <= {"backward", "after backward"}
    assert "backward" in set(ops.loc[ops["op"] == "all_reduce", "phase"])
    for part, path in enumerate(files):
        truth = plain_windows(path)
        assert sorted(truth) == list(range(1, STEPS))
        timer = json.loads((recorded / f"timer.{path.stem.split('.')[-1]}.json").read_text())
        offset = int(trace.info[part]["clock_offset_ns"])
        nv = trace.nvtx[trace.nvtx["part"] == part]
        steps = nv[nv["text"].str.startswith("ProfilerStep#")].sort_values("start")
        backward = nv[nv["text"] == "backward"].sort_values("start")
        assert len(steps) == len(backward) == STEPS - 1
        rank = int(trace.ranks.loc[trace.ranks["part"] == part, "rank"].iloc[0])
        measured = result.steps[result.steps["rank"] == rank].set_index("step")
        for k, (s, b) in enumerate(zip(steps.itertuples(), backward.itertuples(), strict=True), start=1):
            # exactly the markers, as plain Python reads them from the JSON
            assert (s.start + offset, s.end + offset) == truth[k]["step"]
            assert (b.start + offset, b.end + offset) == truth[k]["backward"]
            # the script's own timer: ProfilerStep#k opens in prof.step() between iteration k-1's end and
            # iteration k's start; the autograd ops run inside loss.backward()
            assert timer["step_end_ns"][k - 1] <= s.start + offset <= timer["step_start_ns"][k]
            assert timer["backward_start_ns"][k] <= b.start + offset < b.end + offset <= timer["backward_end_ns"][k]
            # a step lasts at least the iteration the run's own timer measured, and no longer than from the
            # previous iteration's end to the return of the prof.step() that closed its range (a fixed
            # allowance for prof.step() failed on a loaded machine: it took 4.4 ms there)
            step_ms = measured.loc[k, "step_ms"]
            assert step_ms == (s.end - s.start) / 1e6
            assert s.end + offset <= timer["stepped_ns"][k]
            iteration_ms = (timer["step_end_ns"][k] - timer["step_start_ns"][k]) / 1e6
            period_ms = (timer["stepped_ns"][k] - timer["step_end_ns"][k - 1]) / 1e6
            assert iteration_ms <= step_ms <= period_ms
        assert truth[1]["ops"] > 10  # the backward of a 9-layer MLP is many autograd ops, not one


def test_collectives_say_where_the_phases_came_from(recorded):
    from analysis import analyze_collectives

    view = analyze_collectives(sorted(recorded.glob("plain_ddp.rank*.json")), merge=True)
    assert view.traces["phases"].tolist() == [EXPECTED]
    assert len(view.calls) > 0


@pytest.mark.skipif(shutil.which("nsys") is None, reason="nsys not installed")
def test_plain_nsys_of_a_cpu_job_finds_no_pytorch_markers_and_says_why(recorded, capsys):
    """On a CPU build of torch PyTorch writes no NVTX at all: `nsys profile --pytorch=autograd-nvtx`
    does not exist in nsys 2022.4, and torch.autograd.profiler.emit_nvtx raises without CUDA. So a
    plain nsys export of the job (the session's run, recorded under `nsys profile -t nvtx,osrt` as well
    as by its own torch.profiler) has nothing to measure, and the analysis says so and why."""
    assert len(list(recorded.glob("timer.rank*.json"))) == 2  # the job itself ran, both ranks
    sqlite = recorded / "plain_ddp.sqlite"
    assert sqlite.is_file()
    capsys.readouterr()
    assert overlap.main([str(sqlite)]) == 2  # `python -m analysis.overlap`'s main, in this process
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "neither GPU kernels nor NVTX ranges" in err
    assert "emit_nvtx" in err and "CUDA build of torch" in err


def test_an_autograd_nvtx_export_from_elsewhere_names_what_it_lacks():
    """The 2xH100 torchrun export (nsys 2026, PyTorch's ops as NVTX ranges `aten::add, seq = N, op_id =
    M` and FSDP2's forward hooks, a forward-only 0.3 s window) has no step, no root forward, no autograd
    op: none found, and the whole capture is one window."""
    path = ROOT.parent / "shared" / "data" / "nsys2026_2xH100_torchrun.sqlite"
    if not path.exists():
        pytest.skip("../shared/data absent")
    trace = load_trace(path)
    assert phases_of(trace).startswith("none found")
    assert analyze_trace(trace).steps["step"].isna().all()


def test_our_rank_0_with_a_plain_ddp_scripts_rank_1_is_refused(recorded, tmp_path, capsys):
    """tests/analysis/run/test_runs_identity.py's refusal of files of different runs, with the plain job's rank."""
    ours = recording(tmp_path / "ten", "overlap", 10, run_id="aaaa")[0]
    theirs = recorded / "plain_ddp.rank1.json"  # 10 measured steps, as many as ours: only the program differs
    line = one_line(*merge(capsys, ours, theirs))
    assert "overlap.rank0.json is run overlap" in line and "plain_ddp.rank1.json" in line and "another program" in line
