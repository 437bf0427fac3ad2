"""What run_nsys.sh would run on CPU-only and GPU machines (argument level: no GPU is needed)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess

import pytest

from contract import nsys_cli as nsys_mod  # where the install locations are looked up
from ddp.strategies.registry import IMPLEMENTATIONS
from profiling import plan as plan_mod, record
from profiling.plan import ProfilePlan
from tests.profiling.test_nsys import REPO


def value_after(cmd: list[str], flag: str) -> str:
    return cmd[cmd.index(flag) + 1]


def test_cpu_defaults_are_gloo_two_ranks_tiny_nvtx_alone():
    p = ProfilePlan(impls=["overlap"], gpus=0).resolved()
    assert (p.backend, p.device, p.world_size, p.trace) == ("gloo", "cpu", 2, "nvtx")
    assert value_after(p.nsys_options.profile_args(), "--trace") == "nvtx"  # no OS runtime tracing of gloo
    cmd = p.runner_command("overlap")
    assert value_after(cmd, "--world-size") == "2" and value_after(cmd, "--model") == "auto"
    assert value_after(cmd, "--device") == "cpu"


def test_gpu_defaults_are_nccl_over_every_gpu_with_cuda_tracing():
    p = ProfilePlan(impls=["naive"], gpus=4).resolved()
    assert (p.backend, p.device, p.world_size, p.trace) == ("nccl", "cuda", 4, "cuda,nvtx,osrt")
    args = p.nsys_options.profile_args()
    assert value_after(args, "--trace") == "cuda,nvtx,osrt" and value_after(args, "--sample") == "none"
    # the runner picks the largest model that fits the GPU ("auto")
    assert value_after(p.runner_command("naive"), "--model") == "auto"


def test_more_ranks_than_gpus_default_to_gloo_unless_sharing_gpus():
    p = ProfilePlan(impls=["naive"], gpus=1, world_size=2).resolved()
    assert (p.device, p.backend) == ("cuda", "gloo")
    assert "--share-gpus" not in p.runner_command("naive")
    shared = ProfilePlan(impls=["naive"], gpus=1, world_size=2, share_gpus=True).resolved()
    assert shared.backend == "nccl"
    assert shared.runner_command("naive")[-3:] == ["--world-size", "2", "--share-gpus"]
    assert ProfilePlan(impls=["naive"], gpus=1, world_size=2, backend="nccl").resolved().backend == "nccl"


def test_options_override_machine_defaults():
    p = ProfilePlan(
        impls=["flat"],
        gpus=1,
        world_size=2,
        backend="gloo",
        trace="cuda,nvtx",
        run_settings={"steps": 3, "warmup": 0, "batch_size": 8, "context_length": 64, "bucket_mb": 1.5},
    ).resolved()
    assert (p.backend, p.device, p.world_size) == ("gloo", "cuda", 2)
    cmd = p.runner_command("flat")
    for flag, value in (
        ("--steps", "3"),
        ("--warmup", "0"),
        ("--batch-size", "8"),
        ("--context-length", "64"),
        ("--bucket-mb", "1.5"),
        ("--backend", "gloo"),
    ):
        assert value_after(cmd, flag) == value


def test_per_rank_runs_one_session_per_rank_under_torchrun():
    p = ProfilePlan(impls=["overlap"], gpus=8, per_rank=True, runner_args=["--optimizer", "adamw"]).resolved()
    cmd = p.torchrun_command("overlap")
    assert cmd[1:3] == ["-m", "torch.distributed.run"]
    assert cmd[3:6] == ["--standalone", "--nproc-per-node", "8"]
    assert "--no-python" in cmd
    session = cmd[cmd.index("profiling.session") - 2 : cmd.index("--", cmd.index("profiling.session"))]
    assert value_after(session, "--stem") == os.path.join("traces", "overlap.rank{rank}")
    assert value_after(session, "--trace") == "cuda,nvtx,osrt"
    runner = cmd[cmd.index("--", cmd.index("profiling.session")) + 1 :]
    assert "--world-size" not in runner  # torchrun sets the world
    assert runner[-2:] == ["--optimizer", "adamw"]


def test_multi_node_torchrun_arguments_pass_through():
    targs = [
        "--nnodes",
        "2",
        "--node-rank",
        "1",
        "--nproc-per-node",
        "1",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        "29500",
    ]
    p = ProfilePlan(impls=["naive"], gpus=0, per_rank=True, torchrun_args=targs).resolved()
    cmd = p.torchrun_command("naive")
    assert cmd[3 : 3 + len(targs)] == targs and "--standalone" not in cmd


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"world_size": -1}, "world-size=-1"),
        ({"backend": "mpi"}, "backend='mpi'"),
        ({"torchrun_args": ["--nnodes", "2"]}, "--torchrun needs --per-rank"),
        ({"backend": "nccl", "device": "cpu"}, "nccl needs device=cuda"),
        ({"timeout_s": 0}, "timeout=0"),
    ],
)
def test_bad_settings_name_the_value(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", "\\(").replace("+", "\\+")):
        ProfilePlan(impls=["naive"], **kwargs)


def test_cuda_without_gpu_is_refused():
    with pytest.raises(ValueError, match="no GPU"):
        ProfilePlan(impls=["naive"], gpus=0, device="cuda").resolved()


def test_gpu_count_honours_cuda_visible_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,3")
    assert plan_mod.local_gpu_count() == 2
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert plan_mod.local_gpu_count() == 0
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    monkeypatch.setenv("PATH", "/nonexistent")  # no nvidia-smi: no GPU
    assert plan_mod.local_gpu_count() == 0


def run_nsys(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(REPO / "run_nsys.sh"), *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=120,
    )


@pytest.mark.subprocess  # runs run_nsys.sh in a subprocess
def test_help_documents_outputs_replacement_and_options():
    res = run_nsys("--help")
    assert res.returncode == 0
    for needle in (
        "IMPL|all",
        "replaced",
        "--world-size",
        "--model",
        "--steps",
        "--warmup",
        "--batch-size",
        "--context-length",
        "--bucket-mb",
        "--backend",
        "--out-dir",
        "--per-rank",
        "--torchrun",
        "-- args for python -m profiling.run",
    ):
        assert needle in res.stdout, needle


@pytest.mark.subprocess  # runs run_nsys.sh in a subprocess
def test_dry_run_on_a_gpu_machine_prints_the_cuda_command(tmp_path):
    res = run_nsys("all", "--gpus", "2", "--dry-run", "-o", str(tmp_path), "--", "--optimizer", "adamw")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.strip().splitlines()
    assert len(lines) == 4 * len(IMPLEMENTATIONS)  # profile, export, two renames per implementation (nine)
    first = shlex.split(lines[0])
    assert first[0] == "NSYS_NVTX_PROFILER_REGISTER_ONLY=0"
    assert value_after(first, "--trace") == "cuda,nvtx,osrt"
    assert re.fullmatch(
        re.escape(str(tmp_path / ".naive.nsys-rep.partial-")) + r"\d+\.nsys-rep", value_after(first, "--output")
    )
    assert shlex.split(lines[3]) == ["mv", "-f", value_after(first, "--output"), str(tmp_path / "naive.nsys-rep")]
    assert value_after(first, "--backend") == "nccl" and value_after(first, "--world-size") == "2"
    assert first[-2:] == ["--optimizer", "adamw"]
    assert list(tmp_path.iterdir()) == []  # a dry run writes nothing


@pytest.mark.subprocess  # runs run_nsys.sh in a subprocess
def test_bad_implementation_is_one_line_and_exit_2():
    res = run_nsys("bogus")
    assert res.returncode == 2 and "unknown implementation 'bogus'" in res.stderr
    assert "Traceback" not in res.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["naive", "--steps", "0"], "error: steps=0: must be a positive integer"),
        (["naive", "--torchrun", "--nnodes 2"], "error: --torchrun needs --per-rank"),
        (["naive", "--gpus", "0", "--device", "cuda"], "error: device=cuda but no GPU is visible"),
    ],
)
def test_bad_settings_are_one_line_and_exit_2(capsys, args, message):
    assert record.main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1


def test_missing_nsys_is_exit_2_with_install_steps(capsys, monkeypatch):
    monkeypatch.setattr(nsys_mod, "CANDIDATE_GLOBS", ())
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.delenv("NSYS", raising=False)
    assert record.main(["naive", "--gpus", "0", "-o", "/nonexistent/out"]) == 2
    err = capsys.readouterr().err
    assert "bash scripts/install_nsys.sh" in err and "NSYS=/path/to/nsys" in err
    monkeypatch.setenv("NSYS", "/nonexistent/nsys")
    assert record.main(["naive", "--gpus", "0"]) == 2
    assert capsys.readouterr().err.strip() == "error: NSYS=/nonexistent/nsys is not an executable file"


@pytest.mark.subprocess  # runs run_nsys.sh in a subprocess
def test_output_folder_that_is_a_file_is_one_line_and_exit_2(tmp_path):
    taken = tmp_path / "taken"
    taken.write_text("the user's file")
    res = run_nsys("naive", "--gpus", "0", "-o", str(taken))
    assert res.returncode == 2 and res.stderr.strip().splitlines()[-1].startswith(f"error: output folder {taken}")
    assert "Traceback" not in res.stderr and taken.read_text() == "the user's file"


@pytest.mark.subprocess  # runs run_nsys.sh in a subprocess
def test_unknown_model_is_refused_before_profiling():
    res = run_nsys("naive", "--model", "bogus")
    assert res.returncode == 2 and "invalid choice: 'bogus'" in res.stderr and "Traceback" not in res.stderr


def option_help(help_text: str, flag: str) -> str:
    """The help of one option (`--steps STEPS ...`) in argparse's --help output, its lines joined."""
    flat = " ".join(help_text.split())
    found = re.search(rf"{flag} [A-Z_]+ (.*?)(?= -{{1,2}}[a-z]|$)", flat)
    assert found, flag
    return found.group(1)


@pytest.mark.parametrize("field", ["steps", "warmup", "batch_size", "context_length", "bucket_mb", "lr", "optimizer"])
def test_help_shows_the_default_each_run_setting_takes(capsys, field):
    from profiling import run as runner

    with pytest.raises(SystemExit):
        record.main(["--help"])
    shown = option_help(capsys.readouterr().out, "--" + field.replace("_", "-"))
    taken = getattr(runner.parse_args(["--impl", "naive"]), field)  # what profiling.run runs when not told
    assert shown.endswith(f"default: {taken}"), shown
