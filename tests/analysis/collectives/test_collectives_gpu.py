"""The collectives view on the real H100 traces, checked against a pairing written here in plain Python
from the raw tables (sqlite3): the i-th all-reduce kernel of each process is one collective."""

from __future__ import annotations

import sqlite3

import numpy as np
import pytest

from analysis import analyze_collectives
from tests.support.quick import costly_except

ALL_REDUCE = """SELECT k.globalPid, k.start, k."end" FROM CUPTI_ACTIVITY_KIND_KERNEL k
                JOIN StringIds s ON s.id = k.shortName WHERE s.value LIKE 'ncclDevKernel_AllReduce%'"""


def clock_offset(con: sqlite3.Connection) -> int:
    """UTC ns at the trace clock's 0 (these exports have no systemClockNs column: their clock starts at 0)."""
    return con.execute("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME").fetchone()[0]


def kernels_by_process(paths) -> list[list[tuple[int, int]]]:
    """[(start, end) of each all-reduce kernel in start order] per process, on the first file's clock."""
    out, base = [], None
    for path in paths:
        con = sqlite3.connect(path)
        offset = clock_offset(con)
        base = offset if base is None else base
        by_pid: dict[int, list] = {}
        for gpid, start, end in con.execute(ALL_REDUCE):
            by_pid.setdefault(gpid, []).append((start + offset - base, end + offset - base))
        con.close()
        out += [sorted(v) for _, v in sorted(by_pid.items())]
    return out


def independent_pairing(paths) -> list[dict]:
    """Per process and kernel: start, end, wait and transfer, pairing the i-th kernels of the processes."""
    procs = kernels_by_process(paths)
    assert len({len(p) for p in procs}) == 1, "every process has the same number of all-reduces"
    rows = []
    for p, kernels in enumerate(procs):
        for i, (start, end) in enumerate(kernels):
            last = max(other[i][0] for other in procs)
            wait = min(max(last - start, 0), end - start)
            rows.append({"proc": p, "start": start, "end": end, "wait": wait, "transfer": end - start - wait})
    return rows


@pytest.fixture(scope="module")
def view_of(gpu_trace):
    """view_of("overlap.sqlite") -> analyze_collectives of that real trace, computed once for the module
    (the tests only read it)."""
    views: dict = {}

    def view(name: str):
        if name not in views:
            views[name] = analyze_collectives(gpu_trace(name))
        return views[name]

    return view


def all_reduce_rows(view):
    calls = view.calls
    return calls[calls["op"] == "all_reduce"].sort_values(["rank", "start_ns"]).reset_index(drop=True)


@pytest.mark.real  # every kernel of whole real H100 traces
@pytest.mark.parametrize(
    "name", ["naive.sqlite", "overlap.sqlite", "overlap_bucket.sqlite", "torch.sqlite", "flat.sqlite"]
)
def test_every_all_reduce_kernel_is_one_paired_collective(gpu_trace, view_of, name):
    path = gpu_trace(name)
    view = view_of(name)
    mine = all_reduce_rows(view)
    truth = independent_pairing([path])
    assert len(mine) == len(truth)  # each kernel exactly once
    assert mine["paired"].all() and (mine["partners"] == 2).all()
    got = sorted(
        zip(
            mine["start_ns"],
            mine["end_ns"],
            np.round(mine["wait_ms"] * 1e6).astype(np.int64),
            np.round(mine["transfer_ms"] * 1e6).astype(np.int64),
            strict=True,
        )
    )
    want = sorted((r["start"], r["end"], r["wait"], r["transfer"]) for r in truth)
    assert got == want
    duration_ns = mine["end_ns"] - mine["start_ns"]
    assert (np.round((mine["wait_ms"] + mine["transfer_ms"]) * 1e6).astype(np.int64) == duration_ns).all()
    if name == "naive.sqlite":
        assert (mine.groupby("rank").size() == 1096).all()


@pytest.mark.parametrize(
    "name, total, wait, transfer",
    costly_except(
        pytest.mark.real,
        [("overlap.sqlite", 89.6, 73.4, 16.2)],  # the quick loop: the trace the tests below read too
        [
            ("overlap.sqlite", 89.6, 73.4, 16.2),
            ("overlap_bucket.sqlite", 75.0, 66.5, 8.5),
            ("torch.sqlite", 14.6, 8.2, 6.4),
        ],
    ),
)
def test_nccl_time_per_rank_step_splits_as_measured_in_the_issue(view_of, name, total, wait, transfer):
    mine = all_reduce_rows(view_of(name))
    rank_steps = 2 * 5  # every all-reduce kernel over 2 ranks x 5 profiled steps; the issue gives 0.1 ms
    assert mine["duration_ms"].sum() / rank_steps == pytest.approx(total, abs=0.11)
    assert mine["wait_ms"].sum() / rank_steps == pytest.approx(wait, abs=0.11)
    assert mine["transfer_ms"].sum() / rank_steps == pytest.approx(transfer, abs=0.11)


def test_merged_rank_files_pair_like_the_independent_pairing(gpu_trace):
    paths = [gpu_trace("naive.rank0.sqlite"), gpu_trace("naive.rank1.sqlite")]
    mine = all_reduce_rows(analyze_collectives(paths, merge=True))
    truth = independent_pairing(paths)
    assert mine["paired"].all() and len(mine) == len(truth)
    got = sorted(zip(mine["start_ns"], np.round(mine["wait_ms"] * 1e6).astype(np.int64), strict=True))
    assert got == sorted((r["start"], r["wait"]) for r in truth)


def test_one_rank_file_says_it_has_no_partner(view_of):
    view = view_of("naive.rank0.sqlite")
    assert not view.calls["paired"].any() and view.calls["wait_ms"].isna().all()
    assert (view.calls["partners"] == 1).all()
    assert "1 of 2 ranks" in view.traces["note"].iloc[0] and "--merge" in view.traces["note"].iloc[0]
    assert view.stragglers.empty


def test_tags_phase_and_exposed_part_match_the_raw_tables(gpu_trace, view_of):
    path = gpu_trace("overlap.sqlite")
    calls = all_reduce_rows(view_of("overlap.sqlite"))
    in_steps = calls[calls["step"] >= 0]
    assert (in_steps["tag"] != "").all() and set(in_steps["phase"]) <= {"backward", "grad_sync"}
    assert (in_steps["phase"] == "backward").mean() > 0.9  # hooks issue during backward
    con = sqlite3.connect(path)
    rows = con.execute("""SELECT k.globalPid, k.start, k."end", s.value FROM CUPTI_ACTIVITY_KIND_KERNEL k
                          JOIN StringIds s ON s.id = k.shortName""").fetchall()
    con.close()
    pids = sorted({r[0] for r in rows})
    for rank, pid in enumerate(pids):  # ranks number processes in order here (ddp.meta agrees)
        compute = sorted((s, e) for p, s, e, name in rows if p == pid and not name.startswith("nccl"))
        merged = []
        for s, e in compute:
            if merged and s <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], e)
            else:
                merged.append([s, e])
        starts = np.array([m[0] for m in merged])
        mine = calls[calls["rank"] == rank]
        first = mine.iloc[:300]
        for start, end, exposed in zip(first["start_ns"], first["end_ns"], first["exposed_ms"], strict=True):
            i = max(int(np.searchsorted(starts, start, side="right")) - 1, 0)
            covered = 0
            while i < len(merged) and merged[i][0] < end:
                covered += max(0, min(end, merged[i][1]) - max(start, merged[i][0]))
                i += 1
            assert round(exposed * 1e6) == end - start - covered


def test_host_collectives_of_gloo_on_cuda_come_from_the_ranges(view_of):
    view = view_of("gloo_cuda_overlap.sqlite")
    head = view.traces.iloc[0]
    assert head["source"] == "ranges" and head["unpaired_calls"] == 0
    calls = view.calls
    assert (calls["kernel"] == "").all() and (calls["start_ns"] == calls["issue_ns"]).all()
    assert np.allclose(calls["wait_ms"] + calls["transfer_ms"], calls["duration_ms"])


def test_overlap_table_splits_each_step_into_wait_and_transfer(gpu_trace, view_of):
    from analysis import analyze

    path = gpu_trace("overlap.sqlite")
    steps = analyze(path).steps.set_index(["rank", "step"])
    truth = independent_pairing([path])
    # the independent pairing's kernels of rank 0 and 1 in step 4 (by the view's step of each kernel)
    calls = all_reduce_rows(view_of("overlap.sqlite"))
    step_of = dict(zip(zip(calls["rank"], calls["start_ns"], strict=True), calls["step"], strict=True))
    for rank in (0, 1):
        mine = [r for r in truth if r["proc"] == rank and step_of[(rank, r["start"])] == 4]
        row = steps.loc[(rank, 4)]
        assert round(row["comm_wait_ms"] * 1e6) == sum(r["wait"] for r in mine)
        assert round(row["comm_transfer_ms"] * 1e6) == sum(r["transfer"] for r in mine)
        assert (
            row["exposed_comm_wait_ms"] + row["exposed_comm_transfer_ms"]
            <= row["comm_wait_ms"] + row["comm_transfer_ms"] + 1e-9
        )
    assert steps.loc[(0, 4), "comm_wait_ms"] > 150 > steps.loc[(1, 4), "comm_wait_ms"]  # rank 0 waited for rank 1


def test_overlap_split_is_null_without_a_partner(gpu_trace, tmp_path):
    from analysis import analyze
    from tests.analysis.collectives.test_collectives import write_two_gpu_ranks

    alone = analyze(gpu_trace("naive.rank0.sqlite"))
    assert alone.steps["comm_wait_ms"].isna().all() and alone.totals["comm_transfer_ms"].isna().all()
    both = analyze(write_two_gpu_ranks(tmp_path / "two.sqlite"))
    assert list(both.totals["comm_wait_ms"] * 1e6) == pytest.approx([1500, 0])  # rank 0, rank 1
