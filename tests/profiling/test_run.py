"""The profiled program on its own (no nsys): arguments, model choice (the metadata mark's text: tests/contract)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from profiling.run import choose_model
from tests.profiling.test_nsys import REPO
from tests.support import owned


def run(*args: str) -> subprocess.CompletedProcess:
    return owned.run(
        [sys.executable, "-m", "profiling.run", *args], capture_output=True, text=True, cwd=REPO, timeout=180
    )


@pytest.mark.ranks  # spawns ranks in a subprocess
def test_runs_without_nsys_and_reports_every_ranks_steps():
    res = run(
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
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["config"]["model"] == "tiny" and out["config"]["world_size"] == 2
    assert len(out["step_time_s"]) == 2 and all(len(r) == 2 and min(r) > 0 for r in out["step_time_s"])


@pytest.mark.ranks  # spawns ranks in a subprocess
def test_bad_config_is_one_line_and_exit_2():
    res = run("--impl", "naive", "--world-size", "3", "--batch-size", "16")
    assert res.returncode == 2
    assert res.stderr.startswith("error: batch size 16 is not divisible by world size 3")
    assert res.stderr.count("\n") == 1
    zero = run("--impl", "naive", "--world-size", "0")  # outside torchrun: no talk of WORLD_SIZE
    assert zero.returncode == 2 and zero.stderr.startswith("error: world_size=0: must be a positive integer")


def test_auto_model_is_tiny_without_gpu_and_explicit_models_are_kept():
    assert choose_model("auto", 16, 2, 128, "sgd") == "tiny"  # this machine has no GPU
    assert choose_model("small", 16, 2, 128, "sgd") == "small"
