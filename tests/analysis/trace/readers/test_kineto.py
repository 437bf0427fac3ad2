"""torch.profiler (Kineto) traces: the real 2-rank NCCL DDP trace against plain Python, the same
synthetic run written in both formats measured alike, message sizes, and bad input."""

import gzip
import itertools
import json
import os
import re
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis.errors import TraceError
from analysis.overlap import command as overlap
from analysis.overlap.metrics import measure_trace
from analysis.run.loaded_run import load_trace
from analysis.run.run_files import find_runs
from tests.support.progress import without_progress
from tests.support.synthetic_ddp import write_ddp_trace
from tests.support.synthetic_kineto import KinetoWriter, write_kineto_ddp_trace

REPO = Path(__file__).resolve().parents[4]
REAL = REPO.parent / "shared" / "data" / "kineto_ddp_2rank_nccl.json.gz"
NCCL = re.compile(r"^nccl(Dev)?Kernel_")


def run_cli(module, *args):
    return subprocess.run(
        [sys.executable, "-m", module, *map(str, args)],
        cwd=REPO,
        text=True,
        capture_output=True,
        timeout=120,
        env={**os.environ},
    )


# --- plain Python over the raw JSON (no analysis code) -------------------------------------------


def union(intervals):
    merged = []
    for s, e in sorted(intervals):
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    return merged


def length(intervals):
    return sum(e - s for s, e in intervals)


def intersection(a, b):
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        s, e = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if s < e:
            out.append([s, e])
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def ns(us: Decimal) -> int:
    """µs as written in the JSON (a Decimal: no float rounding) to ns."""
    return round(us * 1000)


@pytest.fixture(scope="module")
def real():
    """The real trace with its numbers parsed as decimals: the exact reference."""
    if not REAL.exists():
        pytest.skip(f"{REAL} not present")
    return json.loads(gzip.decompress(REAL.read_bytes()), parse_float=Decimal)


def test_real_trace_totals_equal_plain_python(real):
    kernels = [e for e in real["traceEvents"] if e.get("cat") == "kernel"]
    per_device = {}
    for e in kernels:
        d = per_device.setdefault(e["args"]["device"], {"comm": [], "compute": []})
        d["comm" if NCCL.match(e["name"]) else "compute"].append((ns(e["ts"]), ns(e["ts"]) + ns(e["dur"])))
    assert list(per_device) == [0] and per_device[0]["comm"] and per_device[0]["compute"]

    trace = load_trace(REAL)
    assert trace.source == "kernels" and list(trace.ranks["rank"]) == [0]  # distributedInfo: rank 0 of 2
    assert trace.meta[(0, int(trace.ranks["pid"][0]))]["world_size"] == 2
    _, totals = measure_trace(trace)
    row = totals.iloc[0]
    comm, compute = union(per_device[0]["comm"]), union(per_device[0]["compute"])
    # exact: the frames hold the JSON's times to the ns (totals are ns / 1e6, one float division)
    assert row["comm_ms"] == length(comm) / 1e6
    assert row["compute_ms"] == length(compute) / 1e6
    assert row["overlap_ms"] == length(intersection(comm, compute)) / 1e6
    assert row["overlap_ms"] > 0
    assert row["comm_kernels"] == len(per_device[0]["comm"])
    assert row["compute_kernels"] == len(per_device[0]["compute"])


def test_real_trace_steps_come_from_profiler_step(real):
    """Steps are the ProfilerStep#N ranges; on a GPU rank step k lasts until step k+1 starts, the last
    one until the later of its CPU end and the end of the GPU work launched inside it (measure/phases.py)."""
    events = real["traceEvents"]
    steps = sorted(
        (int(e["name"].split("#")[1]), ns(e["ts"]), ns(e["ts"]) + ns(e["dur"]))
        for e in events
        if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#")
    )
    launch = {e["args"]["correlation"]: ns(e["ts"]) for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")}
    work = [
        (launch[e["args"]["correlation"]], ns(e["ts"]) + ns(e["dur"]))
        for e in events
        if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and e["args"]["correlation"] in launch
    ]
    *_, (_, last_start, last_cpu_end) = steps
    last_end = max([last_cpu_end] + [end for t, end in work if last_start <= t < last_cpu_end])
    want = [(b[1] - a[1]) / 1e6 for a, b in itertools.pairwise(steps)] + [(last_end - last_start) / 1e6]
    per_step, _ = measure_trace(load_trace(REAL))
    assert list(per_step["step"]) == [n for n, *_ in steps] == [4, 5, 6]
    assert per_step["step_ms"].tolist() == pytest.approx(want, abs=1e-5)
    assert (per_step["backward_ms"] > 0).all()  # "## backward ##" is a backward range


def test_real_trace_collective_message_sizes(real):
    calls = [e for e in real["traceEvents"] if e.get("name") == "record_param_comms"]
    frame = load_trace(REAL).collectives
    assert len(frame) == len(calls) == 27
    want = sorted(
        (
            ns(e["ts"]),
            e["args"]["Collective name"],
            e["args"]["In msg nelems"] * {"Float": 4, "Long": 8, "Byte": 1}[e["args"]["dtype"]],
            e["args"]["Group size"],
        )
        for e in calls
    )
    got = list(
        zip(
            frame["start"].tolist(),
            frame["collective"],
            frame["in_bytes"].tolist(),
            frame["group_size"].tolist(),
            strict=True,
        )
    )
    assert got == want  # the same calls, bytes and group sizes
    allreduce = frame[frame["collective"] == "allreduce"]
    assert (allreduce["bytes"] == allreduce["in_nelems"] * 4).all()
    assert set(allreduce["process_group"]) == {"0:default_pg"}


# --- one synthetic run in both formats -----------------------------------------------------------


@pytest.fixture(scope="module")
def both_formats(tmp_path_factory):
    d = tmp_path_factory.mktemp("formats")
    nsys = write_ddp_trace(d / "run.sqlite", n_kernels=6_000, n_ranks=2, n_steps=3, comm_per_step=5, seed=3)
    kineto = write_kineto_ddp_trace(d / "run", n_kernels=6_000, n_ranks=2, n_steps=3, comm_per_step=5, gz=True, seed=3)
    return nsys, kineto


def test_same_run_measures_the_same_in_both_formats(both_formats):
    nsys, kineto = both_formats
    a_steps, _a_totals = measure_trace(load_trace(nsys))
    k_trace = load_trace(kineto)
    b_steps, _b_totals = measure_trace(k_trace)
    assert sorted(k_trace.ranks["rank"]) == [0, 1] and set(k_trace.gpu_ops["part"]) == {0, 1}
    cols = [
        "rank",
        "step",
        "step_ms",
        "backward_ms",
        "compute_ms",
        "comm_ms",
        "overlap_ms",
        "backward_overlap_ms",
        "comm_kernels",
        "compute_kernels",
    ]
    pd.testing.assert_frame_equal(a_steps[cols].reset_index(drop=True), b_steps[cols].reset_index(drop=True))
    assert (b_steps["overlap_ms"] > 0).all()


def test_rank_files_of_one_run_group_into_one_trace(both_formats):
    _, kineto = both_formats
    groups = find_runs(kineto)
    assert len(groups) == 1 and groups[0].name == "run" and len(groups[0].paths) == 2


def test_cpu_only_trace_is_measured_from_its_ranges(tmp_path):
    w = KinetoWriter(tmp_path / "cpu.json")
    w.meta_mark(5, 5, 0, rank=0, world_size=1)
    base = w.base
    w.nvtx(5, 5, [base, base + 100_000], [base + 1_000_000, base + 600_000], ["step 0", "backward"])
    w.nvtx(5, 6, [base + 200_000], [base + 500_000], ["comm:all_reduce:bucket0"], kind=60)  # async
    w.close()
    trace = load_trace(tmp_path / "cpu.json")
    assert trace.source == "ranges" and len(trace.gpu_ops) == 0
    per_step, _ = measure_trace(trace)
    assert per_step["comm_ms"].iloc[0] == pytest.approx(0.3) and per_step["overlap_pct"].iloc[0] == pytest.approx(100)


# --- bad input -------------------------------------------------------------------------------


def _bad_inputs(d: Path) -> dict:
    good = write_kineto_ddp_trace(d / "ok", n_kernels=400, n_ranks=1, n_steps=1, comm_per_step=2, gz=True)[0]
    other = write_kineto_ddp_trace(d / "other", n_kernels=800, n_ranks=2, n_steps=1, comm_per_step=2, gz=True)[1]
    twin = d / "twin.rank0.json.gz"  # the same rank of the same job under another name
    twin.write_bytes(good.read_bytes())
    (d / "truncated.json.gz").write_bytes(good.read_bytes()[:2000])
    (d / "malformed.json").write_text('{"traceEvents": [{"ph": "X", "ts": 1,')
    (d / "not_a_trace.json").write_text('{"hello": "world"}')
    (d / "array.json").write_text("[1, 2, 3]")
    (d / "wrong_types.json").write_text('{"traceEvents": [{"ph": "X", "ts": "soon"}]}')
    (d / "empty_trace.json").write_text('{"traceEvents": []}')
    return {
        "truncated": ([d / "truncated.json.gz"], "truncated or corrupt gzip"),
        "malformed": ([d / "malformed.json"], "not valid JSON"),
        "not_a_trace": ([d / "not_a_trace.json"], "not a torch.profiler (Kineto) trace"),
        "array": ([d / "array.json"], "not a torch.profiler (Kineto) trace"),
        "wrong_types": ([d / "wrong_types.json"], "not a torch.profiler (Kineto) trace"),
        "empty": ([d / "empty_trace.json"], "neither GPU kernels nor user_annotation"),
        "two_jobs": ([good, other], "cannot merge files of different runs"),
        "same_rank_twice": ([good, twin], "both hold rank 0"),
        "mixed_formats": ([good, write_ddp_trace(d / "n.sqlite", 400, 1, 1, 2)], "cannot merge"),
    }


@pytest.fixture(scope="module")
def bad(tmp_path_factory):
    return _bad_inputs(tmp_path_factory.mktemp("bad"))


# One bad input through `python -m analysis.overlap` in a fresh process (the entry point the user runs); the
# others through the same command's main in this process, which is all that entry point calls.
@pytest.mark.parametrize(
    "case",
    [
        pytest.param("truncated", marks=pytest.mark.subprocess),
        "malformed",
        "not_a_trace",
        "array",
        "wrong_types",
        "empty",
        "two_jobs",
        "same_rank_twice",
        "mixed_formats",
    ],
)
def test_bad_input_is_one_line_error(bad, case, capsys):
    paths, message = bad[case]
    with pytest.raises(TraceError, match=re.escape(message)):
        load_trace(paths)
    if case == "truncated":
        done = run_cli("analysis.overlap", "--merge", *paths)
        code, out, err = done.returncode, done.stdout, done.stderr
    else:
        capsys.readouterr()
        code = overlap.main(["--merge", *map(str, paths)])
        out, err = capsys.readouterr()
    assert code == 2 and out == ""
    said = without_progress(err)
    assert said.count("\n") == 1 and message in said and "Traceback" not in said


def test_torch_collective_annotations_are_async_comm_in_foreign_traces(tmp_path):
    """gloo:all_reduce (recorded by PyTorch on gloo's thread) is comm in flight, not a wait of the caller;
    in our runner's traces (ddp.meta) it is left out, its comm:* ranges being the ones nsys sees too."""

    def write(path, ours):
        w = KinetoWriter(path)
        if ours:
            w.meta_mark(5, 5, 0, rank=0, world_size=1)
        b = w.base
        w.nvtx(5, 5, [b, b + 100_000], [b + 1_000_000, b + 900_000], ["ProfilerStep#3", "backward"])
        w.nvtx(5, 9, [b + 200_000], [b + 500_000], ["gloo:all_reduce"])
        return w.close()

    foreign = load_trace(write(tmp_path / "foreign.json", ours=False))
    (row,) = foreign.nvtx[foreign.nvtx["text"] == "gloo:all_reduce"].itertuples()
    assert row.kind == "start_end"
    per_step, _ = measure_trace(foreign)
    assert per_step["step"].tolist() == [3]
    assert per_step["comm_ms"].iloc[0] == pytest.approx(0.3) and per_step["overlap_pct"].iloc[0] == pytest.approx(100)
    ours = load_trace(write(tmp_path / "ours.json", ours=True))
    assert "gloo:all_reduce" not in set(ours.nvtx["text"])


def test_backward_from_autograd_ops_when_no_backward_range(tmp_path):
    w = KinetoWriter(tmp_path / "t.json")
    b = w.base
    w.nvtx(5, 5, [b, b + 2_000_000], [b + 1_000_000, b + 3_000_000], ["ProfilerStep#0", "ProfilerStep#1"])
    for s, e in [(100_000, 200_000), (300_000, 450_000), (2_100_000, 2_200_000)]:
        w.cpu_op(5, 6, b + s, b + e, "autograd::engine::evaluate_function: AddmmBackward0")
    w.close()
    trace = load_trace(tmp_path / "t.json")
    back = trace.nvtx[trace.nvtx["text"] == "backward"]
    # frames count ns from baseTimeNanoseconds (the file's clock)
    got = list(zip(back["start"], back["end"], back["tid"], strict=True))
    assert got == [(100_000, 450_000, 6), (2_100_000, 2_200_000, 6)]


@pytest.mark.parametrize(
    "name",
    [
        "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)",
        "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
        "ncclDevKernel_Generic_4(ncclDevKernelArgsStorage<4096ul>)",
    ],
)
def test_default_comm_pattern_matches_kineto_nccl_kernel_names(name):
    from analysis.trace.patterns import Patterns

    assert Patterns().regex("comm_kernel").search(name)
    assert not Patterns().regex("comm_kernel").search("void at::native::vectorized_elementwise_kernel<4, float>(int)")


def test_batches_cut_between_events_only(tmp_path, monkeypatch):
    """Decoding in small batches gives the same frames, also when names hold the `}, {` a cut looks for."""
    from analysis.trace.readers import kineto_events

    w = KinetoWriter(tmp_path / "t.json")
    n = 300
    start = w.base + np.arange(n) * 10_000
    names = np.array(
        [
            "void f<{lambda()#1}, {lambda()#2}>(int)",
            "ncclDevKernel_AllReduce_Sum_f32_RING_LL()",
            'k {"a": 1}, {"b": [2]}',
        ],
        dtype=object,
    )[np.arange(n) % 3]
    w.kernels(7, 8, 0, 7, start + 1_000, start + 6_000, names, launch=start)
    w.nvtx(7, 7, [w.base], [w.base + n * 10_000], ["step 0"])
    w.close()
    whole = load_trace(tmp_path / "t.json")
    monkeypatch.setattr(kineto_events, "BATCH_BYTES", 150)
    batched = load_trace(tmp_path / "t.json")
    pd.testing.assert_frame_equal(whole.gpu_ops, batched.gpu_ops)
    pd.testing.assert_frame_equal(whole.nvtx, batched.nvtx)
    assert len(batched.gpu_ops) == n and set(batched.gpu_ops["name"]) == set(names)
    assert (batched.gpu_ops["launch_start"] >= 0).all() and batched.gpu_ops["is_comm"].sum() == n // 3
