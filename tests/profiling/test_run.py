"""The profiled program on its own (no nsys): arguments, model choice (the metadata mark's text: tests/contract).

`python -m profiling.run` runs in this process through its `main` (its start as a process is what every
recording of the suite runs, under run_nsys.sh)."""

from __future__ import annotations

import json

import pytest

from profiling.run import choose_model, main


def run(capsys, *args: str) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `python -m profiling.run ARGS`, run in this process."""
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.ranks  # spawns ranks
def test_runs_without_nsys_and_reports_every_ranks_steps(capsys):
    code, stdout, stderr = run(
        capsys,
        "--impl",
        "flat",
        "--steps",
        "2",
        "--warmup",
        "1",
        "--batch-size",
        "2",
        "--context-length",
        "8",
        "--format",
        "json",
    )
    assert code == 0, stderr
    out = json.loads(stdout)
    assert out["config"]["model"] == "tiny" and out["config"]["world_size"] == 2
    assert len(out["step_time_s"]) == 2 and all(len(r) == 2 and min(r) > 0 for r in out["step_time_s"])


def test_bad_config_is_one_line_and_exit_2(capsys):  # refused before any rank starts
    code, _, stderr = run(capsys, "--impl", "naive", "--world-size", "3", "--batch-size", "16")
    assert code == 2
    assert stderr.startswith("error: batch size 16 is not divisible by world size 3")
    assert stderr.count("\n") == 1
    code, _, stderr = run(capsys, "--impl", "naive", "--world-size", "0")  # outside torchrun: no talk of WORLD_SIZE
    assert code == 2 and stderr.startswith("error: world_size=0: must be a positive integer")


def test_auto_model_is_tiny_without_gpu_and_explicit_models_are_kept():
    assert choose_model("auto", 16, 2, 128, "sgd") == "tiny"  # this machine has no GPU
    assert choose_model("small", 16, 2, 128, "sgd") == "small"
