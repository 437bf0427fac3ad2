"""The collectives view on synthetic exports whose every figure is worked out by hand below."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from analysis import analyze_collectives
from analysis.collectives.collective_stats import bus_factor, size_class
from analysis.collectives.command import main
from analysis.errors import TraceError
from analysis.measure.collective_calls import op_of_kernel
from tests.support.synthetic import START_END, NsysWriter


def write_two_gpu_ranks(path):
    """Ranks 0 (pid 100, GPU 0) and 1 (pid 200, GPU 1), step 0 [0, 10000), backward [1000, 6000),
    grad_sync [6000, 9000). Async comm ranges on the autograd threads (101, 201), each launching one
    NCCL all-reduce right after it opens:
      bucket0 (4,000,000 bytes): rank 0 kernel [3000, 5000), rank 1 [4000, 5000) -> last arrival 4000
      bucket1 (1,000 bytes):     rank 0 kernel [5000, 6000), rank 1 [5500, 6000) -> last arrival 5500
    Rank 0 payloads are in int64Value, rank 1's in uint64Value. Compute: rank 0 [1000, 5000), rank 1
    [1000, 4500), one kernel launched in backward. Rank 0 also runs a broadcast kernel [8600, 8700)
    (launched at 8500 in grad_sync) that rank 1 never runs: no partner.
    """
    w = NsysWriter(path, shuffle=True, seed=11)
    for rank, pid, device, column, c in (
        (0, 100, 0, "int64Value", (3000, 5000, 5000, 6000, 5000)),
        (1, 200, 1, "uint64Value", (4000, 5000, 5500, 6000, 4500)),
    ):
        w.process(pid, threads={pid: "python3", pid + 1: "pt_autograd_0"})
        w.meta_mark(pid, pid, 5, implementation="fixture", rank=rank, world_size=2)
        w.nvtx(
            pid,
            pid,
            np.array([0, 1000, 6000]),
            np.array([10000, 6000, 9000]),
            np.array(["step 0", "backward", "grad_sync"], dtype=object),
        )
        opened = np.array([2000, 2500]) if rank == 0 else np.array([3500, 3700])
        w.nvtx(
            pid,
            pid + 1,
            opened,
            np.array([7000, 8000]),
            np.array(["comm:all_reduce:bucket0", "comm:all_reduce:bucket1"], dtype=object),
            kind=START_END,
            end_tid=pid,
            payload=np.array([4_000_000, 1_000]),
            payload_column=column,
        )
        w.kernels(
            pid,
            pid + 1,
            device,
            20,
            np.array([c[0], c[2]]),
            np.array([c[1], c[3]]),
            "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
            launch=opened + 100,
        )
        w.kernels(pid, pid + 1, device, 7, np.array([1000]), np.array([c[4]]), "ampere_sgemm", launch=np.array([1100]))
    w.kernels(
        100, 100, 0, 20, np.array([8600]), np.array([8700]), "ncclDevKernel_Broadcast_RING", launch=np.array([8500])
    )
    return w.close()


def write_two_cpu_ranks(path):
    """NVTX only (gloo on CPU): blocking comm:all_reduce:x, rank 0 [100, 400), rank 1 [250, 400), inside
    grad_sync [100, 450) of step 0 [0, 500). Rank 1's range carries 600 bytes as payload; rank 0's has
    none, but its ddp.meta bucket layout says bucket x holds 600 bytes."""
    w = NsysWriter(path, flavour="2022", cupti=False)
    for rank, pid, start in ((0, 300, 100), (1, 400, 250)):
        w.process(pid)
        buckets = [{"name": "x", "params": ["w"], "bytes": 600}] if rank == 0 else None
        w.meta_mark(pid, pid, 1, implementation="cpu", rank=rank, world_size=2, buckets=buckets)
        w.nvtx(
            pid,
            pid,
            np.array([0, 0, 100]),
            np.array([500, 100, 450]),
            np.array(["step 0", "forward", "grad_sync"], dtype=object),
        )
        w.nvtx(
            pid,
            pid,
            np.array([start]),
            np.array([400]),
            "comm:all_reduce:x",
            payload=None if rank == 0 else np.array([600]),
        )
    return w.close()


@pytest.fixture(scope="module")
def gpu_view(tmp_path_factory):
    return analyze_collectives(write_two_gpu_ranks(tmp_path_factory.mktemp("coll") / "two.sqlite"))


def row(view, rank, tag, op="all_reduce"):
    calls = view.calls
    hit = calls[(calls["rank"] == rank) & (calls["tag"] == tag) & (calls["op"] == op)]
    assert len(hit) == 1
    return hit.iloc[0]


@pytest.mark.parametrize(
    "rank, tag, wait, transfer, exposed, exposed_wait",
    [
        (0, "bucket0", 1000, 1000, 0, 0),
        (1, "bucket0", 0, 1000, 500, 0),
        (0, "bucket1", 500, 500, 1000, 500),
        (1, "bucket1", 0, 500, 500, 0),
    ],
)
def test_wait_transfer_and_exposed_parts(gpu_view, rank, tag, wait, transfer, exposed, exposed_wait):
    r = row(gpu_view, rank, tag)
    assert (r["wait_ms"] * 1e6, r["transfer_ms"] * 1e6) == pytest.approx((wait, transfer))
    assert (r["exposed_ms"] * 1e6, r["exposed_wait_ms"] * 1e6) == pytest.approx((exposed, exposed_wait))
    assert r["exposed_transfer_ms"] * 1e6 == pytest.approx(exposed - exposed_wait)
    assert r["paired"] and r["partners"] == 2 and r["last_rank"] == 1
    assert (r["step"], r["phase"], r["source"]) == (0, "backward", "kernels")


def test_bytes_from_either_payload_column_and_bus_bandwidth(gpu_view):
    for rank in (0, 1):
        r = row(gpu_view, rank, "bucket0")
        assert r["bytes"] == 4_000_000
        assert r["algbw_gbps"] == pytest.approx(4_000_000 / 1000)  # bytes per ns of transfer = GB/s
        assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"] * 2 * (2 - 1) / 2)
    assert row(gpu_view, 0, "bucket1")["issue_ms"] * 1e6 == 2500  # the comm range's start


def test_a_call_without_partner_says_so(gpu_view):
    r = row(gpu_view, 0, "", op="broadcast")
    assert not r["paired"] and r["partners"] == 1 and np.isnan(r["wait_ms"]) and np.isnan(r["bytes"])
    assert (r["phase"], r["issue_ms"] * 1e6, r["exposed_ms"] * 1e6) == ("grad_sync", 8500, 100)
    assert "1 calls of ranks [0]" in gpu_view.traces["note"].iloc[0]


def test_straggler_and_summaries(gpu_view):
    s = gpu_view.stragglers.iloc[0]
    assert (s["step"], s["straggler"], s["times_last"], s["collectives"]) == (0, 1, 2, 2)
    assert s["wait_caused_ms"] * 1e6 == pytest.approx(1500)
    ranks = gpu_view.by_rank.set_index("rank")
    assert ranks.loc[0, "calls"] == 3 and ranks.loc[0, "wait_ms"] * 1e6 == pytest.approx(1500)
    assert ranks.loc[0, "wait_share"] == pytest.approx(1500 / 3100)
    sizes = gpu_view.by_size.set_index(["op", "size_class"])
    assert sizes.loc[("all_reduce", "1M-16M"), "bytes"] == 8_000_000
    assert sizes.loc[("broadcast", "unknown"), "calls"] == 1


def test_cpu_ranges_pair_on_issue_and_completion(tmp_path):
    view = analyze_collectives(write_two_cpu_ranks(tmp_path / "cpu.sqlite"))
    assert view.traces["source"].iloc[0] == "ranges"
    r0, r1 = row(view, 0, "x"), row(view, 1, "x")
    assert (r0["wait_ms"] * 1e6, r0["transfer_ms"] * 1e6, r1["wait_ms"], r1["transfer_ms"] * 1e6) == pytest.approx(
        (150, 150, 0, 150)
    )
    assert r0["bytes"] == 600 and r1["bytes"] == 600  # rank 0 from ddp.meta's buckets, rank 1 from its payload
    assert r0["busbw_gbps"] == pytest.approx(600 / 150)
    assert r0["exposed_ms"] * 1e6 == 300 and r0["phase"] == "grad_sync"  # a blocking call is never compute


def test_filters_rank_and_step(tmp_path):
    path = write_two_gpu_ranks(tmp_path / "two.sqlite")
    view = analyze_collectives(path, rank=1, step=0, peak_busbw=8000)
    assert set(view.calls["rank"]) == {1} and len(view.calls) == 2
    assert view.calls["busbw_pct_peak"].iloc[0] == pytest.approx(50)
    assert view.stragglers.iloc[0]["straggler"] == 1  # stragglers still see every rank
    with pytest.raises(TraceError, match="--step 3: no collective call has it"):
        analyze_collectives(path, step=3)
    assert main([str(path), "--rank", "7"]) == 2


def test_cli_formats_and_bad_input(tmp_path, capsys):
    path = str(write_two_gpu_ranks(tmp_path / "two.sqlite"))
    assert main([path, "--format", "csv"]) == 0
    csv = capsys.readouterr().out
    assert csv.splitlines()[0].startswith("path,implementation,source,rank,step,phase,op,tag,bytes")
    assert len(csv.splitlines()) == 1 + 5
    assert main([path, "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)["traces"][0]
    assert len(doc["calls"]) == 5 and doc["stragglers"][0]["straggler"] == 1 and doc["world_size"] == 2
    assert main([path, "--summary"]) == 0
    out = capsys.readouterr().out
    assert "by rank (ms summed over the calls" in out and "stragglers per step" in out and "calls (one row" not in out
    assert main([str(tmp_path / "missing.sqlite")]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main([path, "--peak-busbw", "-3"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_kernel_names_and_nccl_tests_factors():
    assert [
        op_of_kernel(n)
        for n in [
            "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
            "ncclKernel_ReduceScatter_RING_LL",
            "ncclDevKernel_AllGather_RING_LL",
            "ncclDevKernel_SendRecv",
            "ncclDevKernel_Broadcast_RING",
            "ncclDevKernel_Reduce_Sum_f16",
            "ncclDevKernel_Generic",
        ]
    ] == ["all_reduce", "reduce_scatter", "all_gather", "send_recv", "broadcast", "reduce", ""]
    ops = np.array(["all_reduce", "all_gather", "reduce_scatter", "broadcast", "send_recv", "unknown"], dtype=object)
    got = bus_factor(ops, np.full(6, 8))
    assert np.allclose(got[:5], [14 / 8, 7 / 8, 7 / 8, 1, 1]) and np.isnan(got[5])
    assert list(size_class(np.array([100, 4096, 2 << 20, np.nan]))) == ["<4K", "4K-64K", "1M-16M", "unknown"]


def test_no_collectives_is_not_an_error(tmp_path):
    w = NsysWriter(tmp_path / "plain.sqlite")
    w.process(1)
    w.kernels(1, 1, 0, 7, np.array([10]), np.array([20]), "gemm", launch=np.array([5]))
    view = analyze_collectives(w.close())
    assert view.calls.empty and "no collective calls" in view.traces["note"].iloc[0]
    assert isinstance(view.by_rank, pd.DataFrame)


def test_report_section_blocks(tmp_path):
    from analysis.render.html_page import write_page
    from analysis.report.report_collectives import CollectivesEntry, collectives_section
    from analysis.run.loaded_run import load_trace, measure_run

    run = measure_run(load_trace(write_two_gpu_ranks(tmp_path / "two.sqlite")))
    trace, spans = run.trace, run.backward_spans
    # backward = the compute kernels launched in backward: the one gemm of each rank
    assert spans.to_dict("list") == {"rank": [0, 1], "step": [0, 0], "start_ns": [1000, 1000], "end_ns": [5000, 4500]}
    view = analyze_collectives(trace.path)
    blocks = collectives_section([CollectivesEntry("fixture", run, view)], peak_busbw=100)
    figures = [b for b in blocks if not isinstance(b, str)]
    assert [f.layout.title.text for f in figures] == [
        "Bus bandwidth vs message size (each call, each rank)",
        "fixture: collectives per step, in ms of the step",
        "fixture: who held each step, and why",  # the step's straggler: one bar, its rank, its cause
        figures[3].layout.title.text,
    ]
    held = view.stragglers.dropna(subset=["straggler"])
    (bar,) = figures[2].data
    assert list(bar.x) == held["step"].tolist() and list(bar.y) == held["wait_caused_ms"].tolist()
    assert list(bar.text) == [f"rank {int(r)}" for r in held["straggler"]]
    assert "peak 100" in str(figures[0].layout.annotations)
    notes = "".join(b for b in blocks if isinstance(b, str))
    assert "<h2>Collectives</h2>" in blocks[0] and "1 calls of ranks [0]" in notes
    assert write_page(tmp_path / "page.html", "Collectives", blocks).stat().st_size > 0


def test_wait_and_transfer_per_rank_and_step(gpu_view):
    from analysis.collectives.collective_rows import comm_split_by_step

    split = comm_split_by_step(gpu_view.calls).set_index(["rank", "step"])
    cols = ["comm_wait_ms", "comm_transfer_ms", "exposed_comm_wait_ms", "exposed_comm_transfer_ms"]
    assert list(split.loc[(0, 0), cols] * 1e6) == pytest.approx([1500, 1500, 500, 500])  # broadcast unpaired
    assert list(split.loc[(1, 0), cols] * 1e6) == pytest.approx([0, 1500, 0, 1000])


def test_the_report_has_a_collectives_section(tmp_path, capsys):
    from analysis.report import command as report

    path = write_two_gpu_ranks(tmp_path / "two.sqlite")
    assert report.main([str(path), "-o", str(tmp_path / "out"), "--no-timelines", "--peak-busbw", "100"]) == 0
    page = (tmp_path / "out" / "index.html").read_text()
    assert (
        "<h2>Collectives</h2>" in page and "peak 100 GB" in page and "collectives per step, in ms of the step" in page
    )
    assert report.main([str(path), "-o", str(tmp_path / "bad"), "--peak-busbw", "0"]) == 2
    assert "--peak-busbw" in capsys.readouterr().err and not (tmp_path / "bad").exists()


def test_a_one_process_job_is_not_asked_for_missing_ranks(tmp_path):
    from tests.analysis.overlap_fixtures import write_cpu_only

    view = analyze_collectives(write_cpu_only(tmp_path / "one.sqlite"))  # its ddp.meta says world size 1
    head = view.traces.iloc[0]
    assert (head["world_size"], head["ranks"]) == (1, 1) and not view.calls["paired"].any()
    assert "world size 1" in head["note"] and "--merge" not in head["note"]
