"""The DDP-shaped synthetic trace, analysed and checked against a plain-Python computation from its rows."""

import sqlite3
from collections import defaultdict

import pytest

from analysis import analyze
from tests.support.synthetic_ddp import DdpShape, write_ddp_trace


def union(intervals):
    out = []
    for s, e in sorted(intervals):
        if e <= s:
            continue
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


def length(intervals):
    return sum(e - s for s, e in union(intervals))


def intersection_length(a, b):
    a, b = union(a), union(b)
    i = j = total = 0
    while i < len(a) and j < len(b):
        total += max(0, min(a[i][1], b[j][1]) - max(a[i][0], b[j][0]))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def reference(path):
    """Per pid and step: (comm ns, compute ns, overlap ns), straight from the SQLite rows."""
    db = sqlite3.connect(path)
    strings = dict(db.execute("SELECT id, value FROM StringIds"))
    launches = {
        ((tid >> 24) & 0xFFFFFF, corr): start
        for start, tid, corr in db.execute("SELECT start, globalTid, correlationId FROM CUPTI_ACTIVITY_KIND_RUNTIME")
    }
    text = "COALESCE(text, (SELECT value FROM StringIds WHERE id = textId))"
    steps = defaultdict(list)
    push_pop = f"SELECT start, end, globalTid, {text} FROM NVTX_EVENTS WHERE eventType = 59"
    for start, end, tid, name in db.execute(push_pop):
        if name.startswith("step "):
            steps[(tid >> 24) & 0xFFFFFF].append((start, end, int(name.split()[1])))
    per = defaultdict(lambda: {"comm": [], "compute": []})
    all_compute = defaultdict(list)
    for start, end, gpid, corr, name_id in db.execute(
        "SELECT start, end, globalPid, correlationId, shortName FROM CUPTI_ACTIVITY_KIND_KERNEL"
    ):
        pid = (gpid >> 24) & 0xFFFFFF
        launch = launches[(pid, corr)]
        step = next(n for s, e, n in steps[pid] if s <= launch < e)
        kind = "comm" if strings[name_id].startswith("nccl") else "compute"
        per[(pid, step)][kind].append((start, end))
        if kind == "compute":
            all_compute[pid].append((start, end))
    return {
        key: (length(v["comm"]), length(v["compute"]), intersection_length(v["comm"], all_compute[key[0]]))
        for key, v in per.items()
    }


@pytest.mark.parametrize("flavour", ["2022", "2026"])
def test_metrics_match_a_plain_python_computation(tmp_path, flavour):
    path = write_ddp_trace(
        tmp_path / "ddp.sqlite", n_kernels=12_000, n_ranks=3, n_steps=4, flavour=flavour, shuffle=True, seed=7
    )
    result = analyze(path)
    expected = reference(path)
    got = {
        (r.pid, r.step): (round(r.comm_ms * 1e6), round(r.compute_ms * 1e6), round(r.overlap_ms * 1e6))
        for r in result.steps.itertuples()
    }
    assert got == expected
    assert sorted(result.totals["rank"]) == [0, 1, 2]
    assert (result.steps["comm_kernels"] == 25).all()
    assert 0 < result.summary.iloc[0]["overlap_pct"] < 100


def test_shape_validates_itself():
    with pytest.raises(ValueError, match="n_ranks=0"):
        DdpShape(n_ranks=0)
    with pytest.raises(ValueError, match="too few"):
        DdpShape(n_kernels=10, n_ranks=8)
