"""Compressed exports read as they are (cache/unpacked.py): an .xz or gzipped SQLite export loads as the
plain file does, decompressed into its cache folder (one copy per content) or, with the cache off, into a
temporary folder; nothing else appears beside the input."""

from __future__ import annotations

import gzip
import lzma
from pathlib import Path

import pandas as pd
import pytest

from analysis.cache import key
from analysis.cache.unpacked import PREFIX, compression
from analysis.errors import TraceError
from analysis.run.loaded_run import load_trace
from analysis.trace.patterns import Patterns
from tests.support.synthetic_ddp import write_ddp_trace
from tests.support.synthetic_kineto import write_kineto_ddp_trace

PACK = {"xz": lzma.compress, "gz": gzip.compress}
REPACK = {"xz": lambda b: lzma.compress(b, preset=1), "gz": lambda b: gzip.compress(b, compresslevel=1)}


@pytest.fixture(scope="module")
def plain(tmp_path_factory) -> Path:
    return write_ddp_trace(tmp_path_factory.mktemp("plain") / "ddp.sqlite", n_kernels=2_000, n_ranks=2, n_steps=3)


def packed(plain: Path, folder: Path, kind: str) -> Path:
    folder.mkdir(exist_ok=True)
    target = folder / f"{plain.name}.{kind}"
    target.write_bytes(PACK[kind](plain.read_bytes()))
    return target


def listing(folder: Path) -> list[tuple[str, int, int]]:
    return sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in folder.iterdir())


def same_trace(a, b) -> None:
    pd.testing.assert_frame_equal(a.gpu_ops, b.gpu_ops)
    pd.testing.assert_frame_equal(a.nvtx, b.nvtx)
    assert a.ranks.equals(b.ranks)


@pytest.mark.parametrize("kind", ["xz", "gz"])
def test_cache_off_leaves_the_folder_unchanged(plain, tmp_path, kind) -> None:
    path = packed(plain, tmp_path / "in", kind)
    before = listing(path.parent)
    trace = load_trace(path, cache=False)
    assert listing(path.parent) == before
    same_trace(trace, load_trace(plain, cache=False))
    assert trace.path == str(path)  # named as given, not as the copy read


@pytest.mark.parametrize("kind", ["xz", "gz"])
def test_cache_on_keeps_one_copy_in_the_cache_folder(plain, tmp_path, kind, monkeypatch) -> None:
    monkeypatch.delenv(key.NO_CACHE_ENV, raising=False)
    path = packed(plain, tmp_path / "in", kind)
    before = listing(path.parent)
    load_trace(path, cache=True)
    folder = key.cache_folder(path)
    added = [n for n in listing(path.parent) if n not in before]
    assert [n for n, _, _ in added] == [folder.name]  # nothing beside the input but its cache folder
    copies = sorted(folder.glob(f"{PREFIX}*/*"))
    assert [c.name for c in copies] == ["ddp.sqlite"]
    assert copies[0].read_bytes() == plain.read_bytes()

    # a load the trace cache misses (other patterns) reads the same copy, not a new one
    seen = copies[0].stat().st_mtime_ns
    load_trace(path, Patterns(step=r"^step (\d+)$"), cache=True)
    assert sorted(folder.glob(f"{PREFIX}*/*")) == copies and copies[0].stat().st_mtime_ns == seen

    # the input rewritten (other compressed bytes, the same export): its one copy replaces the old one
    path.write_bytes(REPACK[kind](plain.read_bytes()))
    load_trace(path, cache=True)
    now = sorted(folder.glob(f"{PREFIX}*/*"))
    assert len(now) == 1 and now != copies and now[0].read_bytes() == plain.read_bytes()


def test_gzipped_json_is_left_to_its_reader(tmp_path) -> None:
    made = write_kineto_ddp_trace(tmp_path / "k", 4000, 2, 3, 2, gz=True)
    assert compression(made[0]) is None


def test_a_corrupt_xz_is_a_trace_error_naming_the_given_file(plain, tmp_path) -> None:
    path = packed(plain, tmp_path / "in", "xz")
    path.write_bytes(path.read_bytes()[:2000])
    with pytest.raises(TraceError, match=str(path)):
        load_trace(path, cache=False)
