"""The verify and benchmark CLIs as a user runs them: output formats, exit codes, one-line errors."""

from __future__ import annotations

import contextlib
import csv
import importlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from contract import MEMORY_PARTS
from ddp import cli
from ddp.benchmark_rows import CSV_COLUMNS
from ddp.strategies.registry import IMPLEMENTATIONS, SHARDED
from tests.support import owned

REPO = Path(__file__).resolve().parents[2]


def run(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return owned.run([sys.executable, "-m", *args], cwd=REPO, capture_output=True, text=True, timeout=timeout)


def run_in_process(capsys, module: str, *args: str) -> subprocess.CompletedProcess:
    """`python -m MODULE ARGS` in this process: the same `cli.run_main` wrapper its `__main__` calls."""
    with pytest.raises(SystemExit) as stop:
        cli.run_main(importlib.import_module(module).main, list(args))
    out = capsys.readouterr()
    return subprocess.CompletedProcess(args, stop.value.code, out.out, out.err)


def run_in_process_with_ranks_output(folder: Path, module: str, *args: str) -> subprocess.CompletedProcess:
    """`run_in_process`, with what its spawned ranks write to file descriptors 1 and 2 in the output too,
    as a terminal would show it (capfd does that for a test; this is for a module-scoped fixture)."""
    streams = [open(folder / name, "w+") for name in ("stdout", "stderr")]  # noqa: SIM115 - closed below
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    try:
        with contextlib.redirect_stdout(streams[0]), contextlib.redirect_stderr(streams[1]):
            os.dup2(streams[0].fileno(), 1)
            os.dup2(streams[1].fileno(), 2)
            with pytest.raises(SystemExit) as stop:
                cli.run_main(importlib.import_module(module).main, list(args))
    finally:
        for stream in streams:
            stream.flush()
        for fd, kept in zip((1, 2), saved, strict=True):
            os.dup2(kept, fd)
            os.close(kept)
        for stream in streams:
            stream.close()
    out, err = ((folder / name).read_text() for name in ("stdout", "stderr"))
    return subprocess.CompletedProcess(args, stop.value.code, out, err)


@pytest.mark.ranks  # spawns ranks
def test_verify_passes_every_implementation(capsys):
    out = run_in_process(capsys, "ddp.verify", "--impl", "all", "--world-size", "2", "--steps", "2", "--format", "json")
    assert out.returncode == 0, out.stderr
    records = json.loads(out.stdout)
    assert [r["implementation"] for r in records] == list(IMPLEMENTATIONS)
    assert all(r["result"] == "PASS" and r["elements_not_close"] == 0 for r in records)
    sharded = [r for r in records if r["implementation"] in SHARDED]
    assert sharded and all(r["steps_bit_identical"] == "2/2" and "torch.equal" in r["compared"] for r in sharded)
    assert all(r["steps_bit_identical"] is None for r in records if r["implementation"] not in SHARDED)


@pytest.mark.ranks  # spawns ranks
def test_verify_compute_dtype_runs_the_sharded_strategies_against_a_cast_reference(capsys):
    out = run_in_process(
        capsys, "ddp.verify", "--impl", "all", "--compute-dtype", "fp16", "--steps", "2", "--format", "json"
    )
    assert out.returncode == 0, out.stderr
    records = json.loads(out.stdout)
    assert [r["implementation"] for r in records] == list(SHARDED)  # all: the ones compute_dtype applies to
    assert all("cast to fp16" in r["compared"] and r["max_abs_diff_vs_single"] <= 1e-4 for r in records)


@pytest.mark.ranks  # spawns ranks
def test_verify_fails_when_tolerance_cannot_be_met(capsys):
    """A tolerance below float32 rounding must give FAIL and exit 1: the check can fail."""
    args = ["--impl", "flat", "--optimizer", "adamw", "--steps", "3", "--rtol", "0", "--atol", "0", "--format", "csv"]
    out = run_in_process(capsys, "ddp.verify", *args)
    assert out.returncode == 1, out.stderr
    assert out.stdout.splitlines()[1].endswith("FAIL")


# One sweep for the benchmark's tests (its ranks spawned once): the bucket sweep of the bucketed
# implementations, and torch_fsdp, whose blocking collectives on CPU are all in flight before backward ends.
SWEEP = ["naive", "overlap_bucket", "torch", "torch_fsdp"]
SWEPT_ROWS = [
    ("naive", ""),
    ("overlap_bucket", "1.0"),
    ("overlap_bucket", "10.0"),
    ("torch", "1.0"),
    ("torch", "10.0"),
    ("torch_fsdp", ""),
]


@pytest.fixture(scope="module")
def benchmark_sweep(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess, Path]:
    """`python -m ddp.benchmark` over SWEEP (in this process; rank 0's progress lines are on its stderr), and
    the CSV it wrote."""
    folder = tmp_path_factory.mktemp("benchmark")
    target = folder / "bench.csv"
    args = ["--impl", *SWEEP, "--world-size", "2", "--model", "toy", "--steps", "2", "--warmup", "1"]
    out = run_in_process_with_ranks_output(
        folder, "ddp.benchmark", *args, "--bucket-mb", "1", "10", "--csv", str(target), "--format", "json"
    )
    return out, target


@pytest.mark.ranks  # spawns ranks
def test_benchmark_sweeps_buckets_and_writes_exact_csv(benchmark_sweep, capsys):
    out, target = benchmark_sweep
    assert out.returncode == 0, out.stderr
    rows = list(csv.DictReader(target.open()))
    assert list(rows[0].keys()) == CSV_COLUMNS
    assert [(r["implementation"], r["bucket_mb"]) for r in rows] == SWEPT_ROWS
    assert float(rows[0]["speedup_vs_naive"]) == 1.0 and rows[0]["num_comm_ops"] == "6"
    records = json.loads(out.stdout)
    for r in records:
        assert r["avg_step_time_ms"] > 0 and 0 <= r["comm_fraction"] <= 1
        assert r["speedup_vs_naive"] == pytest.approx(records[0]["avg_step_time_ms"] / r["avg_step_time_ms"], rel=1e-2)
    assert f"[benchmark {len(SWEPT_ROWS)}/{len(SWEPT_ROWS)}]" in out.stderr  # progress goes to stderr
    parts = [f"mem_{p}_mib" for p in MEMORY_PARTS]
    for row, r in zip(rows, records, strict=True):  # memory: the largest rank's parts, their sum; no CUDA here
        assert float(row["mem_peak_mib"]) == pytest.approx(sum(float(row[p]) for p in parts), abs=0.01)
        assert float(row["mem_parameters_mib"]) > 0 and row["cuda_max_allocated_mib"] == ""
        assert len(r["memory_per_rank"]) == 2 and r["memory_per_rank"][0]["cuda_max_allocated_mib"] is None

    again = run_in_process(capsys, "ddp.benchmark", "--impl", "naive", "--model", "toy", "--csv", str(target))
    assert again.returncode == 2 and "exists: pass --overwrite" in again.stderr
    assert len(list(csv.DictReader(target.open()))) == len(SWEPT_ROWS)  # the user's file is untouched


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["ddp.benchmark", "--batch-size", "5", "--world-size", "2"],
            "batch size 5 is not divisible by world size 2: use 2, 4, 6",
        ),
        (["ddp.verify", "--batch-size", "3", "--world-size", "2"], "batch size 3 is not divisible by world size 2"),
        (["ddp.verify", "--impl", "fastest"], "invalid choice: 'fastest'"),
        (["ddp.benchmark", "--world-size", "0"], "world_size=0: must be a positive integer"),
        (["ddp.verify", "--world-size", "-1"], "world_size=-1: must be a positive integer"),
        (["ddp.verify", "--impl", "flat", "--compute-dtype", "bf16"], "applies to the sharded strategies"),
        (["ddp.benchmark", "--impl", "fsdp", "--prefetch", "0"], "prefetch=0: must be a positive integer"),
        (["ddp.verify", "--impl", "torch_fsdp", "--prefetch", "1"], "torch_fsdp cannot gather on demand (prefetch=1)"),
        (["ddp.benchmark", "--csv", "/tmp", "--overwrite"], "--csv /tmp is a folder: name a file"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(capsys, args, message):
    out = run_in_process(capsys, *args)  # refused before any rank starts
    assert out.returncode == 2
    assert message in out.stderr and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


@pytest.mark.subprocess  # the real command: its exit status and stderr as a process
def test_bad_input_exits_the_process_with_one_line():
    out = run("ddp.benchmark", "--batch-size", "5", "--world-size", "2")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith("ddp: error: batch size 5 is not divisible by world size 2: use 2, 4, 6")


@pytest.mark.ranks  # spawns ranks
def test_benchmark_names_its_figure_for_when_communication_ran_not_overlap(benchmark_sweep):
    # analysis.overlap's "overlap" is communication with compute under it; the benchmark's figure is the share
    # of communication in flight before backward ended, which a blocking collective (torch_fsdp on CPU) fills.
    out, target = benchmark_sweep
    assert out.returncode == 0, out.stderr
    rows = {r["implementation"]: r for r in csv.DictReader(target.open())}
    assert "comm_before_backward_end" in CSV_COLUMNS and not any("overlap" in c for c in CSV_COLUMNS)
    assert float(rows["naive"]["comm_before_backward_end"]) == 0  # all of it after backward
    if rows["torch_fsdp"]["comm_clock"] == "host":  # on CPU, where gloo's collectives block the rank
        assert float(rows["torch_fsdp"]["comm_before_backward_end"]) == 1  # all before backward ended ...
        assert float(rows["torch_fsdp"]["avg_comm_time_ms"]) == 0  # ... so none after it
    progress = [line for line in out.stderr.splitlines() if line.startswith("[benchmark ")]
    assert len(progress) == len(SWEPT_ROWS)
    assert all("of communication in flight before backward ended" in p for p in progress), progress
    # the word overlap only where the line says its figure is not analysis.overlap's
    assert all("(not analysis.overlap's overlap %: in flight, not under compute)" in p for p in progress), progress
    # (the implementation overlap_bucket is not the word)
    assert not any("during backward" in p or len(re.findall(r"\boverlap\b", p)) > 2 for p in progress), progress
