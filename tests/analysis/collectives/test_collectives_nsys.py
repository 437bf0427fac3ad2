"""A real nsys export (whatever nsys is installed, 2022.4 here) of two CPU processes issuing collectives
like gloo ranks: the byte counts come from the ranges' payloads as nsys stores them, and wait/transfer
equal a pairing written here from the raw NVTX_EVENTS rows."""

import shutil
import sqlite3

import pytest

from analysis import analyze_collectives
from tests import nsys_cli

NSYS = shutil.which("nsys")
PROGRAM = """
import json, multiprocessing as mp, time, nvtx

def rank(r, barrier):
    nvtx.mark(message="ddp.meta " + json.dumps({"implementation": "nsys_cpu", "rank": r, "world_size": 2}))
    for step in range(2):
        barrier.wait(timeout=60)  # the ranks start each step together: only the sleeps below tell them apart
        nvtx.push_range(f"step {step}")
        nvtx.push_range("backward"); time.sleep(0.005 + 0.02 * r)   # rank 1 is late
        h = nvtx.start_range("comm:all_reduce:bucket0", payload=1 << 20)
        time.sleep(0.01); nvtx.pop_range()
        nvtx.push_range("grad_sync"); time.sleep(0.03 - 0.02 * r); nvtx.end_range(h)
        nvtx.push_range("comm:all_reduce:final", payload=4096); time.sleep(0.002); nvtx.pop_range()
        nvtx.pop_range(); nvtx.pop_range()

if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(2)
    procs = [ctx.Process(target=rank, args=(r, barrier)) for r in range(2)]
    [p.start() for p in procs]; [p.join() for p in procs]
"""


def comm_ranges(path):
    """{pid: [(start, end, text, payload)] in start order} straight from NVTX_EVENTS."""
    con = sqlite3.connect(path)
    rows = con.execute("""SELECT n.start, n."end", COALESCE(n.text, s.value), n.int64Value, n.globalTid
                          FROM NVTX_EVENTS n LEFT JOIN StringIds s ON s.id = n.textId
                          WHERE n.eventType IN (59, 60)""").fetchall()
    con.close()
    out = {}
    for start, end, text, payload, gtid in rows:
        if text and text.startswith("comm:"):
            out.setdefault((gtid >> 24) & 0xFFFFFF, []).append((start, end, text, payload))
    return [sorted(v) for _, v in sorted(out.items())]


@pytest.mark.nsys  # records with the real nsys
@pytest.mark.skipif(NSYS is None, reason="nsys not installed")
def test_real_cpu_export_pairs_ranges_and_reads_payloads(tmp_path):
    pytest.importorskip("nvtx")
    path = nsys_cli.record_program(NSYS, tmp_path, PROGRAM, trace="nvtx")
    view = analyze_collectives(path)
    calls = view.calls.sort_values(["rank", "start_ns"])
    assert view.traces["source"].iloc[0] == "ranges" and calls["paired"].all() and len(calls) == 8
    by_rank = comm_ranges(path)  # pids in order; rank 0 was started first
    assert [len(r) for r in by_rank] == [4, 4]
    want = []
    for i in range(4):
        last = max(r[i][0] for r in by_rank)
        for ranges in by_rank:
            start, end, text, payload = ranges[i]
            wait = min(max(last - start, 0), end - start)
            want.append((start, text.split(":")[2], payload, wait, end - start - wait))
    ns = lambda ms: (ms * 1e6).round().astype(int)
    got = list(
        zip(
            calls["start_ns"],
            calls["tag"],
            calls["bytes"].astype(int),
            ns(calls["wait_ms"]),
            ns(calls["transfer_ms"]),
            strict=True,
        )
    )
    assert sorted(got) == sorted(want)
    assert set(calls["bytes"]) == {1 << 20, 4096}
    late = calls[(calls["rank"] == 0) & (calls["tag"] == "bucket0")]
    assert (late["wait_ms"] > 5).all()  # rank 0 waited the ~20 ms rank 1 spent in its longer backward
    assert set(view.stragglers["straggler"]) == {1}
