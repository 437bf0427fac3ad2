"""analysis.advise on synthetic CPU runs whose answer is worked out by hand, and the CLI's contract."""

from __future__ import annotations

import json
import subprocess

import pytest

from analysis.advise import command as advise_command
from analysis.advise.advice import advise
from contract import ALL_REDUCE, BACKWARD, FORWARD, GRAD_SYNC, OPTIMIZER, PROFILE, comm_range, step_range
from tests.support.progress import without_progress
from tests.support.synthetic import PUSH_POP, START_END, NsysWriter

MS, US, MIB = 1_000_000, 1_000, 2**20
LATENCY_NS, NS_PER_BYTE = 100 * US, 1.0  # the collectives' true cost: 100 us + 1 ns per byte (1 GB/s)
# four parameters in arrival order (backward's order): bytes and when each gradient is ready after backward starts
PARAMS = [
    ("head.weight", 2 * MIB, 1 * MS),
    ("b.w2", 1 * MIB, 2 * MS),
    ("b.w1", MIB // 2, 4 * MS),
    ("emb", MIB // 4, 6 * MS),
]
FLAGS = 4  # bytes per parameter for the "had a gradient" flag
STEP, FORWARD_NS, BACKWARD_NS, OPTIMIZER_NS = 20 * MS, 2 * MS, 7 * MS, 1 * MS
STEPS = 3


def cost(nbytes: float) -> float:
    return LATENCY_NS + nbytes * NS_PER_BYTE


def per_param_schedule() -> tuple[list[tuple[int, int]], int]:
    """Each collective's (issue, end) relative to backward's start, run one at a time; and the tail."""
    out, free = [], 0
    for _, nbytes, ready in PARAMS:
        end = max(ready, free) + cost(nbytes + FLAGS)
        out.append((ready, int(end)))
        free = end
    return out, max(0, int(free) - BACKWARD_NS)


def write_overlap_run(path) -> None:
    """Two identical CPU ranks of the per-parameter `overlap` strategy, STEPS steps, exact collective costs."""
    w = NsysWriter(path, cupti=False)
    schedule, tail = per_param_schedule()
    meta = {
        "implementation": "overlap",
        "world_size": 2,
        "model": "synthetic",
        "bucket_mb": None,
        "param_bytes": {n: b for n, b, _ in PARAMS},
        "buckets": [{"name": n, "params": [n], "bytes": b + FLAGS} for n, b, _ in PARAMS],
    }
    for rank, pid in enumerate((101, 102)):
        w.process(pid)
        w.nvtx(pid, pid, 0, STEPS * STEP + MS, PROFILE, kind=PUSH_POP)
        w.meta_mark(pid, pid, 10, rank=rank, **meta)
        for s in range(STEPS):
            t0 = MS + s * STEP
            b0, b1 = t0 + FORWARD_NS, t0 + FORWARD_NS + BACKWARD_NS
            end = b1 + tail + OPTIMIZER_NS
            w.nvtx(pid, pid, t0, end, step_range(s), kind=PUSH_POP)
            w.nvtx(pid, pid, t0, b0, FORWARD, kind=PUSH_POP)
            w.nvtx(pid, pid, b0, b1, BACKWARD, kind=PUSH_POP)
            w.nvtx(pid, pid, b1, b1 + tail, GRAD_SYNC, kind=PUSH_POP)
            w.nvtx(pid, pid, b1 + tail, end, OPTIMIZER, kind=PUSH_POP)
            for (name, nbytes, _), (issue, done) in zip(PARAMS, schedule, strict=True):
                w.nvtx(
                    pid, pid, b0 + issue, b0 + done, comm_range(ALL_REDUCE, name), kind=START_END,
                    payload=nbytes + FLAGS,
                )  # fmt: skip
    w.close()


@pytest.fixture(scope="module")
def overlap_run(tmp_path_factory):
    path = tmp_path_factory.mktemp("advise") / "overlap.sqlite"
    write_overlap_run(path)
    return path


def test_the_fitted_cost_is_the_collectives_true_cost(overlap_run):
    (result,) = advise([overlap_run], [1.0])
    line = result.cost.overall
    assert line.latency_ns == pytest.approx(LATENCY_NS, rel=1e-6)
    assert line.ns_per_byte == pytest.approx(NS_PER_BYTE, rel=1e-6)


def test_buckets_of_one_parameter_reproduce_the_recorded_run(overlap_run):
    (result,) = advise([overlap_run], [0.1])  # every parameter is over 0.1 MiB: one bucket each
    (c,) = result.candidates
    _, tail = per_param_schedule()
    assert c.buckets == 4
    assert c.predicted_step_ms == pytest.approx(result.measured_step_ms, rel=1e-9)
    assert c.predicted_exposed_comm_ms == pytest.approx(tail / MS, rel=1e-9)
    assert result.measured_step_ms == pytest.approx((FORWARD_NS + BACKWARD_NS + tail + OPTIMIZER_NS) / MS)


def test_collectives_fit_under_backward_at_one_size_and_not_at_another(overlap_run):
    (result,) = advise([overlap_run], [0.1, 100.0])
    small, large = result.candidates
    _, tail = per_param_schedule()
    # 0.1 MiB: the recorded schedule; the last collective (ready at 6 ms) ends at 6.36 ms, under backward (7 ms)
    assert tail == 0 and small.predicted_exposed_comm_ms == 0.0
    # 100 MiB: the 1 MiB first bucket holds head.weight alone (2 MiB, over the cap), then one bucket of the
    # other three, launched when the last is ready (6 ms) and lasting 100 us + their 1.75 MiB + 3 flags
    assert large.buckets == 2
    end = 6 * MS + cost(MIB + MIB // 2 + MIB // 4 + 3 * FLAGS)
    exposed = (end - BACKWARD_NS) / MS
    assert large.predicted_exposed_comm_ms == pytest.approx(exposed, rel=1e-9)
    assert large.predicted_step_ms == pytest.approx(result.measured_step_ms + exposed, rel=1e-9)
    assert result.recommended_bucket_mb == 0.1
    # bounds: no comm exposed in the recording, so perfect overlap is the step; the floor is its compute
    assert result.ideal_step_ms == pytest.approx(result.measured_step_ms)
    assert result.floor_step_ms == pytest.approx((FORWARD_NS + BACKWARD_NS + OPTIMIZER_NS) / MS)


def advise_cli(capsys, *args: str) -> subprocess.CompletedProcess:
    """`python -m analysis.advise ARGS` run in this process (its `main`, which `__main__` calls): exit code,
    stdout, and stderr without the progress lines a loaded machine adds."""
    capsys.readouterr()
    code = advise_command.main(list(args))
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(["analysis.advise", *args], code, out, without_progress(err))


def test_cli_json_has_the_documented_shape(overlap_run, capsys):
    res = advise_cli(capsys, str(overlap_run), "--bucket-mb", "0.1", "100", "--format", "json")
    assert res.returncode == 0, res.stderr
    (run,) = json.loads(res.stdout)["runs"]
    for key in (
        "implementation",
        "trace",
        "measured_step_ms",
        "ideal_step_ms",
        "floor_step_ms",
        "recommended_bucket_mb",
    ):
        assert key in run
    assert run["implementation"] == "overlap" and run["recommended_bucket_mb"] == 0.1
    assert [c["bucket_mb"] for c in run["candidates"]] == [0.1, 100.0]
    assert set(run["candidates"][0]) >= {
        "setting",
        "bucket_mb",
        "recorded",
        "predicted_step_ms",
        "predicted_step_ms_err",
        "predicted_exposed_comm_ms",
        "predicted_exposed_comm_ms_err",
    }
    assert run["candidates"][0]["setting"] == {"bucket_mb": 0.1} and run["knob"] == "bucket_mb"
    # a per-parameter run has no recorded bucket size to keep: the fastest is recommended
    assert run["recommended"]["setting"] == {"bucket_mb": 0.1} and run["recommended"]["kept"] is False


def test_cli_table_marks_the_recommendation(overlap_run, capsys):
    res = advise_cli(capsys, str(overlap_run), "--bucket-mb", "0.1", "100")
    assert res.returncode == 0, res.stderr
    last = res.stdout.rstrip().splitlines()[-1]
    assert last == "recommended bucket size: 0.1 MiB (the fastest predicted; no recorded size to keep)"
    # every prediction with its 95% interval (identical synthetic steps: 0)
    assert " ± 0.000" in res.stdout and "±: 95% interval, 200 bootstrap resamples of the recorded steps" in res.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["--bucket-mb", "0"], "--bucket-mb 0: bucket sizes must be positive"),
        (["--bucket-mb", "nan"], "--bucket-mb nan"),
    ],
)
def test_bad_bucket_sizes_are_one_line_errors(overlap_run, capsys, args, message):
    res = advise_cli(capsys, str(overlap_run), *args)
    assert res.returncode == 2 and res.stderr.startswith(f"error: {message}") and len(res.stderr.splitlines()) == 1


def test_a_run_that_does_not_overlap_is_refused(tmp_path, capsys):
    w = NsysWriter(tmp_path / "naive.sqlite", cupti=False)
    w.process(7)
    w.meta_mark(7, 7, 10, implementation="naive", rank=0, world_size=1)
    w.nvtx(7, 7, 0, 100, step_range(0), kind=PUSH_POP)
    w.close()
    res = advise_cli(capsys, str(tmp_path / "naive.sqlite"))
    assert res.returncode == 2 and "implementation naive" in res.stderr and len(res.stderr.splitlines()) == 1
