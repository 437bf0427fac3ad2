"""The held time of every all-gather of the real bf16 H200 fsdp export (gather_held.py) against a
computation written here from the raw SQLite tables alone (NVTX_EVENTS, the CUPTI kernel, memcpy,
memset and runtime tables), row by row, to the nanosecond."""

from __future__ import annotations

import itertools
import sqlite3
from collections import defaultdict

import pytest

from analysis import analyze_collectives, load_trace
from tests import gpu_traces

NAME = "fsdp_bf16.sqlite"
pytestmark = [
    pytest.mark.real,  # reads the whole real trace
    pytest.mark.skipif(not (gpu_traces.GPU_H200 / f"{NAME}.xz").exists(), reason="../shared/data/gpu_h200 not present"),
]


@pytest.fixture(scope="module")
def trace(gpu_h200_trace):
    return gpu_h200_trace(NAME)


def pid(global_id: int) -> int:
    return (global_id >> 24) & 0xFFFFFF


def plain_held(path) -> dict[tuple[int, int], tuple[int, bool]]:
    """{(pid, issue ns): (held ns, host)} for every comm:all_gather range issued inside a forward or
    backward range, by the rule written out: the gather's kernel is the k-th all-gather kernel its
    process launched for its k-th comm:all_gather range; the unit's first compute op is the first
    non-NCCL op its comm_wait range's thread launched at or after that range's end; ready = max(its
    launch, the end of the op before it on its stream)."""
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    strings = dict(db.execute("SELECT id, value FROM StringIds"))
    nvtx = db.execute(
        "SELECT start, end, globalTid, COALESCE(text, (SELECT value FROM StringIds WHERE id = textId)) "
        "FROM NVTX_EVENTS WHERE eventType IN (59, 60) ORDER BY start"
    ).fetchall()
    runtime = "SELECT start, globalTid, correlationId FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE correlationId IS NOT NULL"
    launch = {(pid(t), c): (s, t & 0xFFFFFF) for s, t, c in db.execute(runtime)}
    ops = []  # (pid, stream, start, end, name, launch, launch tid)
    for table, name in (("KERNEL", "shortName"), ("MEMCPY", "0"), ("MEMSET", "0")):
        for s, e, g, stream, corr, n in db.execute(
            f"SELECT start, end, globalPid, streamId, correlationId, {name} FROM CUPTI_ACTIVITY_KIND_{table}"
        ):
            at, tid = launch.get((pid(g), corr), (-1, -1))
            ops.append((pid(g), stream, s, e, strings.get(n, "") if table == "KERNEL" else table, at, tid))
    pred_end = {}
    by_stream = defaultdict(list)
    for op in ops:
        by_stream[(op[0], op[1])].append(op)
    for mine in by_stream.values():
        mine.sort(key=lambda o: o[2])
        for before, op in itertools.pairwise(mine):
            pred_end[op] = before[3]
    gather_kernels = defaultdict(list)
    compute = defaultdict(list)  # (pid, tid) -> ops in launch order
    for op in ops:
        if op[4].startswith("ncclDevKernel_AllGather"):
            gather_kernels[op[0]].append(op)
        elif not op[4].startswith("nccl") and op[5] >= 0:
            compute[(op[0], op[6])].append(op)
    for k in (gather_kernels, compute):
        for v in k.values():
            v.sort(key=lambda o: o[5])
    phases = [(s, e, pid(t)) for s, e, t, text in nvtx if text in ("forward", "backward")]
    ranges = [(s, pid(t), text.split(":", 2)[2]) for s, e, t, text in nvtx if text.startswith("comm:all_gather:")]
    waits = [
        (s, e, pid(t), t & 0xFFFFFF, text.split(":", 2)[2])
        for s, e, t, text in nvtx
        if text.startswith("comm_wait:all_gather:")
    ]
    out = {}
    seen = defaultdict(int)
    for issue, p, unit in ranges:
        kernel = gather_kernels[p][seen[p]]
        seen[p] += 1
        if not any(a <= issue <= b and q == p for a, b, q in phases):
            continue
        w_end, w_tid = next((e, tid) for s, e, q, tid, u in waits if q == p and u == unit and s >= issue)
        first = next(op for op in compute[(p, w_tid)] if op[5] >= w_end)
        ready = max(first[5], pred_end.get(first, -1))
        end = kernel[3]
        held = max(end - ready, 0) if first[5] < end else 0
        host = first[5] >= end and first[5] - pred_end.get(first, -1) > 10_000
        out[(p, issue)] = (held, host)
    return out


def test_every_gathers_held_time_matches_the_plain_computation(trace):
    expected = plain_held(trace)
    view = analyze_collectives(trace)
    g = view.gathers
    ranks = load_trace([trace]).ranks.set_index("rank")["pid"]
    got = {
        (int(ranks[r]), round(i * 1e6)): (round(h * 1e6), c == "host")
        for r, i, h, c in zip(g["rank"], g["issue_ms"], g["held_ms"], g["cause"], strict=True)
    }
    assert len(expected) == 3400 and got == expected  # 170 units x 2 phases x 5 steps x 2 ranks
    assert sum(h for h, _ in expected.values()) > 0 and any(host for _, host in expected.values())
