"""run_nsys.sh checks what it can before anything starts (one line, exit 2, no nsys run): an output folder
that takes no file, settings the ranks would refuse; and its --dry-run prints what a real run runs."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from profiling import record
from profiling.session import prepare_output_folder
from tests.profiling.test_nsys import REPO, fake_nsys


def run_nsys(tmp_path: Path, *args: str, wrap: list[str] | None = None) -> tuple[subprocess.CompletedProcess, list]:
    """run_nsys.sh ARGS under the stand-in nsys: the finished process, and the nsys calls it made. The profiled
    program is named to nsys but not run (what is checked is what runs around it: no training ranks start)."""
    log = tmp_path / "nsys-calls.jsonl"
    env = {**os.environ, "NSYS": str(fake_nsys(tmp_path)), "FAKE_NSYS_LOG": str(log), "FAKE_NSYS_SKIP_PROGRAM": "1"}
    cmd = [*(wrap or []), "bash", str(REPO / "run_nsys.sh"), *args]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
    calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return res, calls


def refused_up_front(res: subprocess.CompletedProcess, calls: list, message: str) -> None:
    assert res.returncode == 2, res.stderr
    assert res.stderr.startswith(message) and res.stderr.count("\n") == 1, res.stderr
    assert calls == []  # nsys never ran


def test_an_output_folder_under_a_file_is_refused_naming_it(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match=r"output folder .*notes.txt/traces cannot be written to: Not a directory"):
        prepare_output_folder(tmp_path / "notes.txt" / "traces")
    prepare_output_folder(tmp_path / "a" / "b")  # made when missing, and left empty
    assert list((tmp_path / "a" / "b").iterdir()) == []


@pytest.mark.subprocess  # runs run_nsys.sh in a subprocess
def test_a_read_only_filesystem_is_refused_before_nsys_runs(tmp_path):
    # A read-only tmpfs in a private mount namespace: refused writes even for root, and nothing to unmount.
    folder = tmp_path / "ro"
    folder.mkdir()
    if shutil.which("unshare") is None or subprocess.run(["unshare", "-rm", "true"]).returncode != 0:
        pytest.skip("unshare -rm (a private mount namespace) is not available here")
    mount = f'mount -t tmpfs -o ro none {shlex.quote(str(folder))} && exec "$@"'
    res, calls = run_nsys(
        tmp_path, "naive", "--gpus", "0", "-o", str(folder), wrap=["unshare", "-rm", "sh", "-c", mount, "sh"]
    )
    refused_up_front(res, calls, f"error: output folder {folder} cannot be written to: Read-only file system")


@pytest.mark.subprocess  # runs run_nsys.sh and profiling.session in subprocesses
def test_a_folder_that_takes_no_file_is_refused_before_nsys_runs(tmp_path):
    folder = tmp_path / "locked"
    folder.mkdir()
    if os.geteuid() != 0:
        folder.chmod(0o555)  # enough for anyone but root
    elif subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode != 0:
        pytest.skip("running as root, and chattr +i (an immutable folder) is not supported here")
    try:
        res, calls = run_nsys(tmp_path, "naive", "--gpus", "0", "-o", str(folder))
        refused_up_front(res, calls, f"error: output folder {folder} cannot be written to: ")
        # Each rank's own session (--per-rank) checks its folder too.
        env = {**os.environ, "NSYS": str(fake_nsys(tmp_path)), "RANK": "0"}
        cmd = [sys.executable, "-m", "profiling.session", "--stem", str(folder / "x.rank{rank}"), "--", "true"]
        one = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, timeout=60)
        assert one.returncode == 2 and one.stderr.startswith(f"error: output folder {folder} cannot be written to")
    finally:
        if os.geteuid() == 0:
            subprocess.run(["chattr", "-i", str(folder)])
        folder.chmod(0o755)
    assert list(folder.iterdir()) == []


@pytest.mark.parametrize(
    "args, message",
    [
        (["overlap", "--batch-size", "3"], "error: batch size 3 is not divisible by world size 2: use 2, 4, 6"),
        (["overlap", "-n", "4", "--batch-size", "6"], "error: batch size 6 is not divisible by world size 4"),
        (
            ["naive", "--per-rank", "--torchrun", "--nnodes 2 --nproc-per-node 2", "--batch-size", "6"],
            "error: batch size 6 is not divisible by world size 4",
        ),
        (["all", "--compute-dtype", "bf16"], "error: compute_dtype='bf16' applies to the sharded strategies"),
    ],
)
def test_settings_the_ranks_would_refuse_are_refused_before_anything_starts(tmp_path, capsys, args, message):
    out = tmp_path / "traces"
    assert record.main([*args, "--gpus", "0", "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1, err
    assert not out.exists()  # not even the folder was made


def test_a_batch_that_splits_is_accepted_and_an_unknown_world_leaves_it_to_the_ranks(tmp_path, capsys):
    for args in (["-n", "3", "--batch-size", "3"], ["--per-rank", "--torchrun", "--nnodes 2", "--batch-size", "3"]):
        assert record.main(["overlap", *args, "--gpus", "0", "-o", str(tmp_path), "--dry-run"]) == 0, args
    capsys.readouterr()


def pid_free(line: str) -> str:
    return re.sub(r"\.partial-\d+\.", ".partial-PID.", line)


@pytest.mark.subprocess  # runs run_nsys.sh twice (stand-in nsys, the program not run)
def test_dry_run_prints_the_commands_a_real_run_runs(tmp_path):
    out = tmp_path / "traces"
    args = ["naive", "--gpus", "0", "-o", str(out), "--model", "toy", "--steps", "1", "--warmup", "0"]
    dry, calls = run_nsys(tmp_path, *args, "--dry-run")
    assert dry.returncode == 0 and calls == [], dry.stderr
    lines = [shlex.split(pid_free(line)) for line in dry.stdout.splitlines()]
    res, calls = run_nsys(tmp_path, *args)
    assert res.returncode == 0, res.stderr[-2000:]
    assert len(lines) == 4 and len(calls) == 2  # nsys profile, nsys export; then two renames
    env = [f"{k}={v}" for k, v in calls[0]["env"].items()]
    assert lines[0] == [*env, *shlex.split(pid_free(shlex.join([str(tmp_path / "bin" / "nsys"), *calls[0]["argv"]])))]
    assert lines[1] == shlex.split(pid_free(shlex.join([str(tmp_path / "bin" / "nsys"), *calls[1]["argv"]])))
    assert env[0] == "NSYS_NVTX_PROFILER_REGISTER_ONLY=0" and env[1].startswith("DDP_PROFILER=nsys ")
    assert lines[2][:2] == lines[3][:2] == ["mv", "-f"]
    assert {lines[2][3], lines[3][3]} == {str(out / "naive.sqlite"), str(out / "naive.nsys-rep")}
    assert sorted(p.name for p in out.iterdir()) == ["naive.nsys-rep", "naive.sqlite"]
