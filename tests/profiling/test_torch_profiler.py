"""`bash run_nsys.sh naive overlap --profiler torch` on CPU (no nsys involved): one torch.profiler trace
per rank with the NVTX contract's ranges as record_function ranges (async comm ranges marked
start/end), only the measured steps, and the analysis reads them."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pytest
import torch

from analysis.overlap import command as overlap
from tests.profiling.test_end_to_end import PHASES, expected_collectives_per_step
from tests.support import owned
from tests.support.recordings import KEEP, STEPS, WARMUP

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def traces(torch_recordings) -> Path:
    """The suite's torch.profiler recordings (tests/support/recordings.py), naive and overlap in them."""
    out = torch_recordings("naive", "overlap")
    for impl in ("naive", "overlap"):
        res = torch_recordings.runs[impl]
        assert [row["impl"] for row in json.loads(res.stdout)].count(impl) == 2  # one row per rank's trace
        assert "USDT:" not in res.stderr  # Kineto's start/stop markers are dropped (profiling.session)
        assert "[profiling.torch_profile] wrote " in res.stderr and "\t" not in res.stderr  # says what its number is
    return out


def load(path: Path) -> dict:
    return json.loads(gzip.decompress(path.read_bytes()))


@pytest.mark.ranks  # records with torch.profiler in spawned ranks
def test_one_trace_per_rank_and_nothing_else_is_touched(traces, torch_recordings):
    assert sorted(p.name for p in traces.iterdir()) == torch_recordings.outputs()  # no partial or temporary file
    assert {f"{impl}.rank{r}.json.gz" for impl in ("naive", "overlap") for r in (0, 1)} <= set(
        torch_recordings.outputs()
    )
    assert (traces / KEEP).read_text() == "not ours"


@pytest.mark.ranks  # records with torch.profiler in spawned ranks
@pytest.mark.parametrize("impl, asynchronous", [("naive", False), ("overlap", True)])
def test_every_rank_has_the_measured_steps_phases_and_one_range_per_collective(traces, impl, asynchronous):
    per_step = expected_collectives_per_step()
    for rank in (0, 1):
        doc = load(traces / f"{impl}.rank{rank}.json.gz")
        meta = doc["ddp.meta"]
        assert meta["implementation"] == impl and meta["rank"] == rank and meta["world_size"] == 2
        assert meta["profiler"].startswith("torch.profiler ") and doc["distributedInfo"]["rank"] == rank
        ranges = [e for e in doc["traceEvents"] if e.get("cat") == "user_annotation"]
        names = [e["name"] for e in ranges]
        # warm-up steps 0..WARMUP-1 ran before the profiler started and are absent
        assert sorted(n for n in names if n.startswith("step ")) == [f"step {i}" for i in range(WARMUP, WARMUP + STEPS)]
        for phase in PHASES:
            assert names.count(phase) == STEPS, (rank, phase)
        assert names.count("profile") == 1
        comm = [e for e in ranges if e["name"].startswith("comm:all_reduce:")]
        assert len(comm) == STEPS * per_step
        assert {e["args"].get("ddp.kind") == "start_end" for e in comm} == {asynchronous}
        (profile,) = [e for e in ranges if e["name"] == "profile"]
        # the async ranges are timed apart from Kineto's clock: they still lie inside the capture
        assert all(profile["ts"] <= e["ts"] and e["ts"] + e["dur"] <= profile["ts"] + profile["dur"] for e in comm)


@pytest.mark.ranks  # records with torch.profiler in spawned ranks
def test_overlap_hides_far_more_communication_than_naive(traces, capsys):
    summary = {}
    for impl in ("naive", "overlap"):
        ranks = [str(traces / f"{impl}.rank{r}.json.gz") for r in (0, 1)]
        assert overlap.main(["--merge", "--format", "json", *ranks]) == 0
        (trace,) = json.loads(capsys.readouterr().out)["traces"]
        assert trace["source"] == "ranges" and trace["implementation"] == impl
        # metadata as it is: a CPU run has no GPU, driver or CUDA; the profiler is torch's, with its version
        assert trace["profiler"] == f"torch.profiler {torch.__version__}"
        absent = ("gpus", "driver", "cuda_driver", "cuda", "nccl")
        assert {k: trace["metadata"][k] for k in absent} == dict.fromkeys(absent)
        summary[impl] = trace["summary"]
    assert summary["naive"]["ranks"] == summary["overlap"]["ranks"] == 2
    assert summary["naive"]["overlap_pct"] < 10, summary["naive"]
    assert summary["overlap"]["overlap_pct"] > summary["naive"]["overlap_pct"] + 25, summary


@pytest.mark.ranks  # records with torch.profiler in spawned ranks
def test_a_failing_run_exits_1_and_leaves_previous_outputs(tmp_path):
    (tmp_path / "naive.rank0.json.gz").write_text("previous")
    res = owned.run(
        [
            "bash",
            str(REPO / "run_nsys.sh"),
            "naive",
            "--profiler",
            "torch",
            "--gpus",
            "0",
            "-o",
            str(tmp_path),
            "--model",
            "toy",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "DDP_TIMEOUT_S": "bogus"},  # read by the ranks only: the run starts, then fails
    )
    assert res.returncode == 1
    assert "error: naive: the profiled run failed (exit 2)" in res.stderr and "Traceback" not in res.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["naive.rank0.json.gz"]
    assert (tmp_path / "naive.rank0.json.gz").read_text() == "previous"


def test_plan_names_a_bad_profiler_and_builds_torch_commands():
    from profiling.plan import ProfilePlan

    with pytest.raises(ValueError, match="profiler='perf'"):
        ProfilePlan(impls=["overlap"], profiler="perf")
    plan = ProfilePlan(impls=["overlap"], out_dir=Path("out"), profiler="torch", per_rank=True, gpus=0).resolved()
    assert plan.runner_command("overlap")[-2:] == ["--torch-trace", str(Path("out") / "overlap")]
    cmd = plan.torchrun_command("overlap")
    assert "profiling.session" not in cmd and cmd[cmd.index("--no-python") + 1 :] == plan.runner_command("overlap")
    assert "torch.profiler" in plan.describe()


@pytest.mark.ranks  # records with torch.profiler in spawned ranks
def test_ddp_meta_records_each_ranks_memory(traces):
    """ddp.meta's `memory`: the wrapper's accounting after the warm-up, against the model's own tensors."""
    from ddp.training.models import build_model

    net = build_model("tiny", context_length=64)
    params = sum(p.numel() * p.element_size() for p in net.parameters())
    buffers = sum(b.numel() * b.element_size() for b in net.buffers())
    for path in sorted(traces.glob("naive.rank*.json.gz")) + sorted(traces.glob("overlap.rank*.json.gz")):
        meta = load(path)["ddp.meta"]
        memory = meta["memory"]
        assert memory["parameters"] == params + buffers, path.name
        assert memory["gradients"] == sum(meta["param_bytes"].values()) == params, path.name  # all trainable
        assert memory["optimizer_state"] == 0 and memory["gathered"] == 0  # plain SGD keeps no state
        assert memory["activations"] > 0 and memory["cuda_max_allocated"] is None
        parts = ("parameters", "gradients", "optimizer_state", "gathered", "comm_buffers", "activations")
        assert memory["peak"] == sum(memory[p] for p in parts)


def test_push_pop_payloads_go_to_the_exported_events_of_their_name_in_order():
    """record_function takes no payload: the recorder notes (name, start, payload) and puts each into the
    k-th exported event of that name; a name whose counts differ, or one noted outside the recording,
    gets none."""
    from contract import PAYLOAD_KEY
    from profiling.torch_profile import add_payloads

    def event(name, ts):
        return {"ph": "X", "cat": "user_annotation", "name": name, "ts": ts, "args": {"External id": 1}}

    events = [event("comm:all_reduce:b", 30.0), event("comm:all_reduce:b", 10.0), event("comm:broadcast:x", 5.0)]
    events.append({"ph": "X", "cat": "cpu_op", "name": "comm:all_reduce:b", "ts": 1.0, "args": {}})
    noted = [("comm:all_reduce:b", 100, 8), ("comm:all_reduce:b", 300, 16), ("comm:broadcast:x", 50, 4)]
    noted += [("comm:broadcast:x", 60, 4), ("comm:all_reduce:b", 900, 32)]  # broadcast: 2 noted, 1 exported
    assert add_payloads(events, noted, since_ns=0, until_ns=500) == 2  # the one at 900 came after the stop
    assert [e["args"].get(PAYLOAD_KEY) for e in events] == [16, 8, None, None]
    assert events[0]["args"]["External id"] == 1  # the rest of the args kept
