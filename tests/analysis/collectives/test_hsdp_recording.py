"""A real recording of `hsdp` on 4 gloo ranks (2 replicas x 2 shards) under nsys: every call is paired within its
group (the shard all-gathers/reduce-scatters apart from the replicate all-reduces), and the per-group overlap
equals a plain-Python computation from the export's raw NVTX rows. Rank 2 is slowed in `data` every step
(`--slow-rank`): the analysis names it, with `data` as the cause (one recording for both, not one more)."""

from __future__ import annotations

import json
import shutil
import sqlite3
from collections import defaultdict
from pathlib import Path

import pytest

from analysis import analyze_trace
from analysis.collectives.collective_rows import call_rows
from analysis.run.loaded_run import load_trace
from contract import GROUPS_KEY, META_PREFIX
from tests import small_run
from tests.analysis.collectives.test_groups import NS_PER_MS, _union
from tests.support.slow_rank import assert_the_slowed_rank_is_named_with_its_place_as_cause, slow_rank_args

pytestmark = [pytest.mark.nsys, pytest.mark.ranks, pytest.mark.skipif(shutil.which("nsys") is None, reason="no nsys")]
PUSH_POP = 59  # NVTX_EVENTS.eventType of a push/pop range (60: start/end)
COMPUTE_PHASES = ("forward", "backward", "optimizer")
WORLD, SLOW, PLACE, MS = 4, 2, "data", 1000
STEPS = 5  # 5 steps held of 5 is past the recurrence rule's chance (0.25^5 < 1% / 4)


@pytest.fixture(scope="module")
def hsdp(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("hsdp")
    extra = ["--world-size", str(WORLD), "--model", "tiny", *slow_rank_args(SLOW, PLACE, MS)]
    done = small_run.record(["hsdp"], out, STEPS, 1, *extra, timeout_s=400)
    assert done.returncode == 0, done.stderr[-3000:]
    return out / "hsdp.sqlite"


def raw(path: Path) -> tuple[list[dict], dict[int, list[tuple[int, int]]]]:
    """Each comm range in a step as a call (rank, op, group, members, step, start, end) and each rank's compute:
    its forward/backward/optimizer ranges less its blocking comm ranges and its waits for in-flight ones."""
    con = sqlite3.connect(path)
    rows = con.execute(
        """SELECT n.start, n."end", COALESCE(n.text, s.value), n.eventType, n.globalTid
           FROM NVTX_EVENTS n LEFT JOIN StringIds s ON s.id = n.textId"""
    ).fetchall()
    pid = lambda tid: (tid >> 24) & 0xFFFFFF
    meta = {pid(g): json.loads(t[len(META_PREFIX) :]) for _, _, t, _, g in rows if t and t.startswith(META_PREFIX)}
    ranged = [(s, e, t, kind, meta[pid(g)]["rank"]) for s, e, t, kind, g in rows if t and e and pid(g) in meta]
    steps = [(s, e, int(t.split()[1]), r) for s, e, t, _, r in ranged if t.startswith("step ")]
    calls, busy, idle = [], defaultdict(list), defaultdict(list)
    for s, e, t, kind, r in ranged:
        if t.startswith("comm:") and ":broadcast:" not in t:
            op, rest = t[len("comm:") :].split(":", 1)
            group = rest.split("@")[1]
            step = next((n for a, b, n, rr in steps if rr == r and a <= s <= b), None)
            if step is not None:
                members = tuple(next(m for m in meta.values() if m["rank"] == r)[GROUPS_KEY][group]["ranks"])
                calls.append(
                    {"rank": r, "op": op, "group": group, "members": members, "step": step, "start": s, "end": e}
                )
        if t in COMPUTE_PHASES:
            busy[r].append((s, e))
        if (t.startswith("comm:") and kind == PUSH_POP) or t.startswith("comm_wait:"):
            idle[r].append((s, e))
    compute = {r: _minus(_union(busy[r]), _union(idle[r])) for r in busy}
    return calls, compute


def _minus(keep: list[tuple[int, int]], cut: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out = []
    for s, e in keep:
        pieces = [(s, e)]
        for cs, ce in cut:
            pieces = [p for a, b in pieces for p in ((a, min(b, cs)), (max(a, ce), b)) if p[1] > p[0]]
        out.extend(pieces)
    return out


def test_calls_pair_within_their_group_and_per_group_overlap_is_the_plain_python_one(hsdp):
    calls, compute = raw(hsdp)
    trace = load_trace(hsdp)
    rows, _ = call_rows(trace)
    assert len(rows) == len(calls) and rows["paired"].all()
    # the k-th call of an op in a step of a group, on each member, is one collective: its partners are the group
    mine = defaultdict(list)
    for c in sorted(calls, key=lambda c: (c["rank"], c["start"])):
        mine[(c["rank"], c["members"], c["op"], c["step"])].append(c)
    logical = defaultdict(dict)
    for (rank, members, op, step), each in mine.items():
        for seq, c in enumerate(each):
            logical[(members, op, step, seq)][rank] = c
    assert all(sorted(by_rank) == list(members) for (members, *_), by_rank in logical.items())
    for row in rows.itertuples():
        group = logical[(tuple(json.loads(f"[{row.group_ranks}]")), row.op, row.step, row.seq)]
        last = max(c["start"] for c in group.values())
        assert row.partners == 2 and row.last_rank == min(r for r, c in group.items() if c["start"] == last)
    # shard all-gathers/reduce-scatters and replicate all-reduces apart: per rank, one row each
    spans = defaultdict(list)
    for c in calls:
        spans[(c["rank"], c["group"])].append((c["start"], c["end"]))
    groups = analyze_trace(trace).by_group
    assert sorted(zip(groups["rank"], groups["group"], strict=True)) == sorted(spans)
    ops = {(c["group"], c["op"]) for c in calls}
    assert ops == {
        ("shard", "all_gather"),
        ("shard", "reduce_scatter"),
        ("shard", "all_reduce"),
        ("replicate", "all_reduce"),
    }
    for g in groups.itertuples():
        comm, busy = _union(spans[(g.rank, g.group)]), compute[g.rank]
        hidden = sum(max(0, min(e, be) - max(s, bs)) for s, e in comm for bs, be in busy)
        assert g.calls == len(spans[(g.rank, g.group)])
        assert g.comm_ms * NS_PER_MS == pytest.approx(sum(e - s for s, e in comm), abs=1)
        assert g.overlap_ms * NS_PER_MS == pytest.approx(hidden, abs=1)


def test_the_slowed_rank_is_named_with_data_as_cause(hsdp):
    assert_the_slowed_rank_is_named_with_its_place_as_cause(hsdp, WORLD, STEPS, SLOW, PLACE, MS)
