"""More ranks than GPUs with NCCL: the loaded library's version, the decision, the one-line errors.

No GPU here: the decision is tested as a function; the version is read from stand-in libnccl.so.2
files built with the C compiler (one loaded by ctypes, one by LD_PRELOAD, as a newer NCCL is in practice).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ddp.launch import gpu_sharing
from ddp.launch.gpu_sharing import NcclLibrary, decode_version, explain_failure, plan_sharing
from ddp.launch.rank_failures import failure_message
from tests.ddp.test_cli import run_in_process

REPO = Path(__file__).resolve().parents[3]
OLD = NcclLibrary("/venv/nvidia/nccl/lib/libnccl.so.2", (2, 28, 9))
NEW = NcclLibrary("/tmp/nccl/libnccl.so.2", (2, 32, 3))
# The refusal as torch 2.11 + NCCL 2.28.9 raised it with two ranks on one H100 (../shared/notes/gpu.md).
DUPLICATE = (
    "DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.cpp:77, invalid usage "
    "(run with NCCL_DEBUG=WARN for details), NCCL version 2.28.9\nncclInvalidUsage: This usually reflects "
    "invalid usage of NCCL library.\nLast error:\nDuplicate GPU detected : rank 0 and rank 1 both on CUDA "
    "device 60"
)


def test_version_codes_decode_both_schemes():
    assert decode_version(23203) == (2, 32, 3)
    assert decode_version(22809) == (2, 28, 9)
    assert decode_version(2708) == (2, 7, 8)  # before 2.9: X*1000 + Y*100 + Z


def test_nccl_paths_come_from_the_maps_once_each_and_preload_wins():
    maps = (
        "7f00-7f01 r--p 00000000 08:01 1 /venv/nvidia/nccl/lib/libnccl.so.2\n"
        "7f01-7f02 r-xp 00001000 08:01 1 /venv/nvidia/nccl/lib/libnccl.so.2\n"
        "7f03-7f04 r--p 00000000 08:01 2 /usr/lib/libncclx.txt\n"
        "7f05-7f06 r-xp 00000000 08:01 3 /tmp/nccl/libnccl.so.2\n"
        "7f07-7f08 rw-p 00000000 00:00 0 \n"
        "7f09-7f0a r-xp 00000000 08:01 4 /venv/torch/lib/libtorch_cuda.so\n"
    )
    paths = gpu_sharing.nccl_paths_in_maps(maps)
    assert paths == ["/venv/nvidia/nccl/lib/libnccl.so.2", "/tmp/nccl/libnccl.so.2"]
    assert gpu_sharing.pick_library(paths, "") == "/venv/nvidia/nccl/lib/libnccl.so.2"
    assert gpu_sharing.pick_library(paths, "/tmp/nccl/libnccl.so.2") == "/tmp/nccl/libnccl.so.2"
    assert gpu_sharing.pick_library([], "") is None


@pytest.mark.parametrize("backend, ranks, gpus", [("nccl", 2, 2), ("nccl", 1, 4), ("gloo", 2, 0), ("nccl", 2, 0)])
def test_nothing_to_decide_when_each_rank_has_its_gpu(backend, ranks, gpus):
    assert plan_sharing(backend, ranks, gpus, OLD, share_gpus=False) == gpu_sharing.SharingPlan()
    assert "nothing to share" in plan_sharing(backend, ranks, gpus, OLD, share_gpus=True).note


def test_old_nccl_is_refused_in_one_line_naming_the_ways_out():
    for share in (False, True):
        with pytest.raises(ValueError) as err:
            plan_sharing("nccl", 2, 1, OLD, share_gpus=share)
        msg = str(err.value)
        assert "\n" not in msg and "2 ranks on 1 GPU(s) with NCCL 2.28.9 (/venv/nvidia/nccl/lib/libnccl.so.2)" in msg
        assert "--backend gloo" in msg and "at most 1 rank(s)" in msg and "NCCL >= 2.30" in msg
        assert "NCCL_MULTI_RANK_GPU_ENABLE=1" in msg and "MPS" in msg
        assert ("--share-gpus needs NCCL >= 2.30" in msg) == share


def test_new_nccl_shares_only_when_asked():
    with pytest.raises(
        ValueError,
        match="unless NCCL_MULTI_RANK_GPU_ENABLE=1; add --share-gpus to set it, "
        "or use --backend gloo, or at most 1 rank",
    ):
        plan_sharing("nccl", 2, 1, NEW, share_gpus=False)
    plan = plan_sharing("nccl", 2, 1, NEW, share_gpus=True, mps=True)
    assert plan.env == {"NCCL_MULTI_RANK_GPU_ENABLE": "1"}
    assert "NCCL 2.32.3" in plan.note and "timings of ranks sharing a GPU are not multi-GPU timings" in plan.note
    assert "MPS" not in plan.note
    assert "nvidia-cuda-mps-control -d" in plan_sharing("nccl", 2, 1, NEW, share_gpus=True, mps=False).note
    # Already enabled by the user (e.g. a setup script): accepted, with the same caveat.
    assert plan_sharing("nccl", 2, 1, NEW, share_gpus=False, enabled_by_env=True).env


def test_unknown_nccl_runs_unless_sharing_was_asked_for():
    assert plan_sharing("nccl", 2, 1, None, share_gpus=False) == gpu_sharing.SharingPlan()
    with pytest.raises(ValueError, match="no NCCL library loaded"):
        plan_sharing("nccl", 2, 1, None, share_gpus=True)


def test_gloo_sharing_gpus_says_what_its_timings_are():
    assert "not multi-GPU timings" in plan_sharing("gloo", 2, 1, None, share_gpus=False).note


def test_mps_is_seen_by_its_control_pipe(tmp_path):
    assert not gpu_sharing.mps_running({"CUDA_MPS_PIPE_DIRECTORY": str(tmp_path)})
    (tmp_path / "control").touch()
    assert gpu_sharing.mps_running({"CUDA_MPS_PIPE_DIRECTORY": str(tmp_path)})


def test_duplicate_gpu_error_becomes_one_line():
    line = explain_failure(DUPLICATE)
    assert line is not None and "\n" not in line
    assert line.startswith(
        "NCCL 2.28.9 refused two ranks on one GPU (Duplicate GPU detected: rank 0 and rank 1 both on CUDA device 60)"
    )
    assert "--backend gloo" in line and "--share-gpus" in line and "NCCL >= 2.30" in line
    assert explain_failure("RuntimeError: something else") is None

    class DistBackendError(RuntimeError):
        pass

    assert failure_message(DistBackendError(DUPLICATE.split(": ", 1)[1])) == line


def _fake_nccl(folder: Path, code: int) -> Path:
    folder.mkdir(parents=True)
    src = folder / "nccl.c"
    src.write_text(f"int ncclGetVersion(int *v) {{ *v = {code}; return 0; }}\n")
    lib = folder / "libnccl.so.2"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True, timeout=60)
    return lib


@pytest.mark.subprocess  # compiles a library, runs subprocesses
@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs a C compiler for the stand-in libnccl")
def test_loaded_library_version_is_read_from_the_mapped_library_and_preload_wins(tmp_path):
    built = _fake_nccl(tmp_path / "wheel", 22809)  # what torch's wheel would bring
    newer = _fake_nccl(tmp_path / "preload", 23203)  # what a user preloads
    # before the library is loaded: none mapped (CPU-only torch is not imported here); then the one loaded
    probe = (
        "import ctypes, sys; from ddp.launch.gpu_sharing import loaded_nccl; print(loaded_nccl()); "
        "ctypes.CDLL(sys.argv[1]); lib = loaded_nccl(); print(lib.path, '.'.join(map(str, lib.version)))"
    )
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    alone = subprocess.run(
        [sys.executable, "-c", probe, str(built)], capture_output=True, text=True, cwd=REPO, env=env, timeout=180
    )
    assert alone.stdout.splitlines() == ["None", f"{built} 2.28.9"], alone.stderr
    preloaded = subprocess.run(
        [sys.executable, "-c", probe, str(built)],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**env, "LD_PRELOAD": str(newer)},
        timeout=180,
    )
    assert preloaded.stdout.splitlines()[-1] == f"{newer} 2.32.3", preloaded.stderr


@pytest.mark.ranks  # spawns ranks through the CLIs
def test_share_gpus_on_the_clis_without_gpus(capfd, monkeypatch):
    """The flag exists where ranks are launched; with no GPU it has nothing to share and says so (the CLIs
    run in this process through the wrapper their `__main__` calls: their own starts are tested elsewhere)."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    res = run_in_process(capfd, "ddp.verify", "--impl", "flat", "--world-size", "2", "--steps", "1", "--share-gpus")
    assert res.returncode == 0, res.stderr
    assert "--share-gpus: 2 rank(s) on 0 GPU(s), nothing to share" in res.stderr
    for module in ("ddp.benchmark", "profiling.run", "profiling.record"):
        assert "--share-gpus" in run_in_process(capfd, module, "--help").stdout, module
