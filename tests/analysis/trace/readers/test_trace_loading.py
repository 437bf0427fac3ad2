"""The loader: typed frames, schema flavours, joins, read-only access, merging one-rank files."""

import hashlib
import os

import numpy as np
import pandas as pd
import pytest

from analysis.run.loaded_run import load_trace
from analysis.trace.build_frames import NARROW_COLUMNS, SMALLEST_COLUMNS, row_lookup as _row_lookup
from analysis.trace.readers import sqlite_read
from tests.analysis.overlap_fixtures import write_cpu_only, write_two_ranks
from tests.support.synthetic import NsysWriter

GPU_COLUMNS = [
    "part",
    "pid",
    "device",
    "stream",
    "start",
    "end",
    "correlation_id",
    "name",
    "kind",
    "launch_start",
    "launch_tid",
    "comm_bytes",
    "is_comm",
]
NVTX_COLUMNS = ["part", "pid", "tid", "end_tid", "start", "end", "text", "kind", "domain", "payload"]


@pytest.mark.parametrize("flavour", ["2022", "2026"])
def test_frames_are_typed_and_sorted(tmp_path, flavour):
    trace = load_trace(write_two_ranks(tmp_path / "t.sqlite", flavour=flavour, registered=flavour == "2022"))
    ops, nvtx = trace.gpu_ops, trace.nvtx
    assert list(ops.columns) == GPU_COLUMNS and list(nvtx.columns) == NVTX_COLUMNS
    # times int64; identifiers (NARROW_COLUMNS) int32 when they fit, as they do here; file parts, devices,
    # streams (SMALLEST_COLUMNS) and comm_bytes (all -1 in an nsys export) int8, the smallest that holds them
    small = (*SMALLEST_COLUMNS, "comm_bytes")
    assert all(ops[c].dtype == np.int32 for c in NARROW_COLUMNS)
    assert all(ops[c].dtype == np.int8 for c in small)
    assert all(
        ops[c].dtype == np.int64 for c in GPU_COLUMNS if c not in ("name", "kind", "is_comm", *NARROW_COLUMNS, *small)
    )
    assert set(ops["kind"].cat.categories) == {"kernel", "memcpy", "memset"}
    assert (ops["comm_bytes"] == -1).all()  # nsys exports record no message size on kernels
    assert ops.groupby("kind", observed=True).size().to_dict() == {"kernel": 11, "memcpy": 1, "memset": 1}
    key = ops[["part", "pid", "device", "start"]].to_records(index=False).tolist()
    assert key == sorted(key)  # written shuffled, loaded sorted
    assert trace.source == "kernels"
    assert trace.profiler == "nsys"
    assert trace.profiler_version == {"2022": "2022.4.2.1", "2026": "2026.2.1.210"}[flavour]


def test_launches_join_on_correlation_id_within_the_process(tmp_path):
    """Both processes reuse correlation ids 1..n: a kernel must get its own process's runtime call."""
    ops = load_trace(write_two_ranks(tmp_path / "t.sqlite")).gpu_ops
    got = ops.set_index(["pid", "start"])[["launch_start", "launch_tid"]]
    assert got.loc[(200, 200)].tolist() == [150, 200]
    assert got.loc[(100, 300)].tolist() == [250, 101]
    assert got.loc[(100, 1100)].tolist() == [660, 102]  # the memcpy launched from the gloo thread
    assert set(ops.loc[ops["is_comm"], "start"]) == {400, 950, 1100, 1200, 350}


def test_nvtx_frame_kinds_threads_and_domains(tmp_path):
    nvtx = load_trace(write_two_ranks(tmp_path / "t.sqlite")).nvtx
    comm = nvtx[nvtx["text"] == "comm:all_reduce:b0"].iloc[0]
    assert (comm["kind"], comm["tid"], comm["end_tid"]) == ("start_end", 101, 100)
    assert nvtx.loc[nvtx["text"] == "ncclAllReduce", "domain"].tolist() == ["NCCL"]
    assert set(nvtx.loc[nvtx["pid"] == 100, "domain"]) == {""}  # pid 100 never created domain 1
    assert "never closed" not in set(nvtx["text"])  # a range without an end has no extent
    marks = nvtx[nvtx["kind"] == "mark"]
    assert (marks["start"] == marks["end"]).all() and len(marks) == 2


def test_ranks_and_metadata(tmp_path):
    trace = load_trace(write_two_ranks(tmp_path / "t.sqlite"))
    assert trace.ranks[["rank", "pid", "device"]].values.tolist() == [[0, 200, 1], [1, 100, 0]]
    assert trace.meta[(0, 100)]["world_size"] == 2
    assert trace.implementation == "fixture"


def test_ranks_fall_back_to_device_order_without_metadata(tmp_path):
    w = NsysWriter(tmp_path / "t.sqlite")
    for pid, device in ((7, 1), (9, 0)):
        w.kernels(pid, pid, device, 7, np.array([10]), np.array([20]), "k", launch=np.array([5]))
    trace = load_trace(w.close())
    assert trace.ranks[["rank", "pid", "device"]].values.tolist() == [[0, 9, 0], [1, 7, 1]]
    assert trace.implementation == "t"


def test_cpu_only_export(tmp_path):
    trace = load_trace(write_cpu_only(tmp_path / "c.sqlite"))
    assert trace.source == "ranges" and len(trace.gpu_ops) == 0
    assert trace.ranks[["rank", "pid", "device"]].values.tolist() == [[0, 300, -1]]


def test_opening_never_changes_or_adds_files(tmp_path):
    path = write_two_ranks(tmp_path / "t.sqlite")
    os.chmod(path, 0o444)
    before = (hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mtime_ns, sorted(os.listdir(tmp_path)))
    load_trace(path)
    after = (hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mtime_ns, sorted(os.listdir(tmp_path)))
    assert before == after


def test_sqlite3_fallback_reads_the_same_frames(tmp_path, monkeypatch):
    path = write_two_ranks(tmp_path / "t.sqlite", flavour="2022", registered=True)
    fast = load_trace(path)

    def unavailable(*args, **kwargs):
        raise ImportError("connectorx missing")

    monkeypatch.setattr(sqlite_read, "read_connectorx", unavailable)
    slow = load_trace(path)
    pd.testing.assert_frame_equal(fast.gpu_ops, slow.gpu_ops, check_categorical=False)
    pd.testing.assert_frame_equal(fast.nvtx, slow.nvtx, check_categorical=False)


def test_one_rank_files_merge_on_session_start_clock(tmp_path):
    paths = []
    for rank, utc in ((0, 1_000_000_000_000), (1, 1_000_000_005_000)):
        w = NsysWriter(tmp_path / f"r{rank}.sqlite", session_start_utc_ns=utc, system_clock_ns=100)
        w.meta_mark(500, 500, 1, implementation="merged", rank=rank)
        w.kernels(500, 500, 0, 7, np.array([200]), np.array([300]), "k", launch=np.array([150]))
        paths.append(w.close())
    trace = load_trace(paths)
    assert trace.ranks[["rank", "part", "pid"]].values.tolist() == [[0, 0, 500], [1, 1, 500]]
    ops = trace.gpu_ops.sort_values("part")
    assert ops["start"].tolist() == [200, 5_200] and ops["launch_start"].tolist() == [150, 5_150]


@pytest.mark.parametrize("spread", [1, 10**9])  # dense ids: direct table; sparse ids: sort + search
def test_row_lookup_matches_brute_force(spread):
    rng = np.random.default_rng(spread)
    rt_pid = rng.integers(1, 4, 300)
    rt_corr = rng.choice(np.arange(1, 400 * spread, spread), 300, replace=False)
    pid = np.r_[rt_pid[:200], [9, 1]]
    corr = np.r_[rt_corr[:200], [rt_corr[0], -1]]
    expected = [
        next((i for i in range(300) if rt_pid[i] == p and rt_corr[i] == c), -1) for p, c in zip(pid, corr, strict=True)
    ]
    assert _row_lookup(rt_pid, rt_corr, pid, corr).tolist() == expected


def test_nvtx_texts_all_null_load_as_empty_strings(tmp_path):
    """A reader types an all-NULL text column as integers; the loader still gives strings."""
    w = NsysWriter(tmp_path / "t.sqlite")
    w.kernels(7, 7, 0, 7, np.array([10]), np.array([20]), "k", launch=np.array([5]))
    w.nvtx(7, 7, np.array([1, 30]), np.array([25, 60]), np.array([None, None], dtype=object))
    w.nvtx(7, 7, 3, None, None, kind=34)  # a mark without text
    trace = load_trace(w.close())
    assert trace.nvtx["text"].tolist() == ["", "", ""]
    assert trace.meta == {} and trace.ranks["rank"].tolist() == [0]


def test_meta_marks_that_are_not_json_objects_are_ignored(tmp_path):
    w = NsysWriter(tmp_path / "t.sqlite")
    for pid, device in ((7, 1), (9, 0)):
        w.kernels(pid, pid, device, 7, np.array([10]), np.array([20]), "k", launch=np.array([5]))
    w.nvtx(7, 7, 1, None, "ddp.meta [1]", kind=34)
    w.nvtx(9, 9, 1, None, 'ddp.meta "rank"', kind=34)
    trace = load_trace(w.close())
    assert trace.meta == {}
    assert trace.ranks[["rank", "pid"]].values.tolist() == [[0, 9], [1, 7]]
