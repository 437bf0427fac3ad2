"""The analysis cache, run for real (the suite turns it off everywhere else: conftest.py): a load read back
equals the load, dtypes included; a changed size, mtime or content, or other code, is a miss; the table
CLIs print a kept answer without loading; two commands writing at once; a folder that cannot be written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pandas as pd
import pytest

from analysis import open_runs
from analysis.cache import key, loads
from analysis.run import loaded_run as runs
from analysis.run.loaded_run import load_trace
from analysis.trace.patterns import Patterns
from tests.support.synthetic_ddp import write_ddp_trace
from tests.support.synthetic_kineto import write_kineto_ddp_trace

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(autouse=True)
def cache_on(monkeypatch):
    monkeypatch.delenv(key.NO_CACHE_ENV, raising=False)


@pytest.fixture
def trace_file(tmp_path) -> Path:
    return write_ddp_trace(tmp_path / "ddp.sqlite", n_kernels=4_000, n_ranks=2, n_steps=4)


@pytest.fixture
def reads(monkeypatch) -> list:
    """The reader's calls (each a real read of the files)."""
    calls: list = []
    real = runs.read_trace
    monkeypatch.setattr(runs, "read_trace", lambda *a, **k: calls.append(a) or real(*a, **k))
    return calls


def entries(path: Path, kind: str = "trace-") -> list[Path]:
    folder = key.cache_folder(path)
    return sorted(p for p in folder.iterdir() if p.name.startswith(kind)) if folder.is_dir() else []


def assert_same_trace(a, b) -> None:
    for f in fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, pd.DataFrame):
            pd.testing.assert_frame_equal(x, y, check_exact=True)
            for col in x.columns:  # object vs str columns and categories are told apart too
                assert str(x[col].dtype) == str(y[col].dtype), (f.name, col)
                if isinstance(x[col].dtype, pd.CategoricalDtype):
                    assert x[col].cat.categories.dtype == y[col].cat.categories.dtype, (f.name, col)
        else:
            assert x == y and type(x) is type(y), f.name


def test_hit_reads_back_the_same_trace_without_the_reader(trace_file, reads):
    first = load_trace(trace_file)
    assert len(reads) == 1 and len(entries(trace_file)) == 1
    assert key.cache_folder(trace_file).parent == trace_file.parent  # beside, never inside the export
    second = load_trace(trace_file)
    assert len(reads) == 1  # the cache answered
    assert_same_trace(first, second)
    assert_same_trace(first, load_trace(trace_file, cache=False))  # and it is what a fresh load gives


def test_kineto_trace_and_several_files_round_trip(tmp_path, reads):
    files = write_kineto_ddp_trace(tmp_path / "k", n_kernels=2_000, n_ranks=2, n_steps=3, gz=True)
    first = load_trace(files)  # a merged run: keyed on both files, kept beside the first
    again = load_trace(files)
    assert len(reads) == 1
    assert_same_trace(first, again)
    os.utime(files[1], ns=(files[1].stat().st_atime_ns, files[1].stat().st_mtime_ns + 10**9))
    load_trace(files)  # the second file changed: a miss
    assert len(reads) == 2 and len(entries(files[0])) == 1  # the stale entry went


def test_changed_mtime_size_content_or_code_is_a_miss(trace_file, reads, monkeypatch):
    load_trace(trace_file)
    st = trace_file.stat()
    os.utime(trace_file, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    load_trace(trace_file)
    assert len(reads) == 2
    assert len(entries(trace_file)) == 1  # the entry of the old mtime was removed when the new one was written

    # the same size and mtime, other bytes (a rewrite in place): the sampled hash tells
    data = bytearray(trace_file.read_bytes())
    st = trace_file.stat()
    before = key.file_state(trace_file)
    data[24] ^= 0xFF  # SQLite's file change counter, in the first page
    trace_file.write_bytes(bytes(data))
    os.utime(trace_file, ns=(st.st_atime_ns, st.st_mtime_ns))
    after = key.file_state(trace_file)
    assert (after["size"], after["mtime_ns"]) == (before["size"], before["mtime_ns"])
    assert after["sample"] != before["sample"]
    load_trace(trace_file)
    assert len(reads) == 3

    with trace_file.open("ab") as f:  # a longer file
        f.write(b"\0" * 4096)
    os.utime(trace_file, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert key.file_state(trace_file)["size"] != before["size"]
    load_trace(trace_file)
    assert len(reads) == 4

    monkeypatch.setattr(loads, "code_fingerprint", lambda: "other code")  # an upgrade
    load_trace(trace_file)
    assert len(reads) == 5
    load_trace(trace_file, patterns=Patterns(step=r"^step (\d+)$"))  # other patterns: their own entry
    assert len(reads) == 6


def test_sampled_hash_sees_every_sampled_region(tmp_path):
    path = tmp_path / "big.bin"
    size = 4 * 2**20
    path.write_bytes(bytes(size))
    base = key.sampled_hash(path, size)
    stride = (size - 2 * key.HEAD) // key.BLOCKS
    for offset in (0, key.HEAD + 5 * stride, size - 1):  # head, a middle block, tail
        data = bytearray(size)
        data[offset] = 1
        path.write_bytes(bytes(data))
        assert key.sampled_hash(path, size) != base, offset


def test_cache_off(trace_file, reads, monkeypatch):
    load_trace(trace_file, cache=False)
    load_trace(trace_file, cache=False)
    assert len(reads) == 2 and not key.cache_folder(trace_file).exists()
    monkeypatch.setenv(key.NO_CACHE_ENV, "1")
    open_runs([trace_file]).overlap()
    assert len(reads) == 3 and not key.cache_folder(trace_file).exists()
    monkeypatch.delenv(key.NO_CACHE_ENV)
    open_runs([trace_file], no_cache=True).overlap()
    open_runs([trace_file], jobs=2, no_cache=True).overlap()  # the per-file task keeps the setting
    assert not key.cache_folder(trace_file).exists()


def test_unwritable_folder_loads_without_cache(trace_file, reads, monkeypatch, capsys):
    blocker = trace_file.parent / "not-a-folder"
    blocker.write_text("")
    monkeypatch.setattr(loads, "cache_folder", lambda p: blocker / "cache")  # mkdir: NotADirectoryError
    expected = load_trace(trace_file, cache=False)
    got = load_trace(trace_file)
    load_trace(trace_file)
    assert len(reads) == 3  # no cache, no error
    assert_same_trace(expected, got)
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("note: no analysis cache in")  # one note, not one per load


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only folder")
def test_read_only_folder(trace_file, reads, tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    path = folder / trace_file.name
    path.write_bytes(trace_file.read_bytes())
    folder.chmod(0o555)
    try:
        load_trace(path)
        load_trace(path)
    finally:
        folder.chmod(0o755)
    assert len(reads) == 2 and not key.cache_folder(path).exists()


def test_damaged_entry_is_a_miss_and_replaced(trace_file, reads):
    load_trace(trace_file)
    (entry,) = entries(trace_file)
    (entry / "gpu_ops.arrow").write_bytes(b"not arrow")
    again = load_trace(trace_file)
    assert len(reads) == 2
    assert_same_trace(load_trace(trace_file), again)
    assert len(reads) == 2  # written anew


def cli(*args: str, env_off: bool = False) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != key.NO_CACHE_ENV}
    if env_off:
        env[key.NO_CACHE_ENV] = "1"
    return subprocess.run([sys.executable, "-m", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("command", ["overlap", "collectives"])
def test_answer_cache_prints_the_same_without_loading(trace_file, command, monkeypatch, capsys):
    from analysis import cli as cli_module

    module = __import__(f"analysis.{command}.command", fromlist=["main"])
    args = [str(trace_file), "--format", "json"]
    assert module.main([*args, "--no-cache"]) == 0
    fresh = capsys.readouterr()
    assert not key.cache_folder(trace_file).exists()
    assert module.main(args) == 0
    cold = capsys.readouterr()
    assert module.main([*args, "--jobs", "2"]) == 0  # --jobs does not change the answer: the same key
    assert capsys.readouterr().out == cold.out

    def no_load(*a, **k):
        raise AssertionError("loaded although the answer was kept")

    monkeypatch.setattr(cli_module, "open_from_args", no_load)
    assert module.main(args) == 0
    warm = capsys.readouterr()
    assert fresh.out == cold.out == warm.out and json.loads(warm.out)
    assert len(entries(trace_file, "answer-")) == 1
    monkeypatch.undo()
    monkeypatch.delenv(key.NO_CACHE_ENV, raising=False)
    assert module.main([*args, "--step", "99"]) == 2  # a failure is never kept
    assert len(entries(trace_file, "answer-")) == 1


@pytest.mark.subprocess
def test_two_commands_at_once_and_no_pandas_when_warm(trace_file):
    expected = cli("analysis.overlap", str(trace_file), "--per-step", env_off=True)
    assert expected.returncode == 0
    env = {k: v for k, v in os.environ.items() if k != key.NO_CACHE_ENV}
    both = [
        subprocess.Popen(
            [sys.executable, "-m", "analysis.overlap", str(trace_file), "--per-step"],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=300) for p in both]
    assert [p.returncode for p in both] == [0, 0]
    quiet = lambda err: [line for line in err.splitlines() if not line.startswith("[overlap] ")]  # timed progress
    assert [o for o, _ in outs] == [expected.stdout] * 2
    assert [quiet(e) for _, e in outs] == [quiet(expected.stderr)] * 2
    assert len(entries(trace_file)) == 1 and len(entries(trace_file, "answer-")) == 1  # whole, one each
    assert not list(key.cache_folder(trace_file).glob(".tmp-*"))  # no leftovers
    probe = f"import runpy, sys; sys.argv = ['overlap', {str(trace_file)!r}, '--per-step']; "
    probe += "runpy.run_module('analysis.overlap', run_name='__main__')"
    loaded = "print(sorted(m for m in ('pandas', 'numpy') if m in sys.modules))"
    code = f"import sys\ntry:\n    {probe}\nexcept SystemExit: pass\n{loaded}"
    warm = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert warm.stdout == expected.stdout + "[]\n"  # answered without importing pandas or numpy


def test_no_cache_holds_for_the_whole_command_and_no_longer(trace_file, reads):
    from analysis import cli as cli_module

    seen = []

    def body() -> int:
        seen.append(os.environ.get(key.NO_CACHE_ENV))
        load_trace(trace_file)
        return 0

    assert cli_module.run(body, no_cache=True) == 0  # timeline and report: their loads, a baseline's too
    assert seen == ["1"] and key.NO_CACHE_ENV not in os.environ
    assert not key.cache_folder(trace_file).exists()
    assert cli_module.run(body) == 0
    assert len(entries(trace_file)) == 1
