"""Eight gloo ranks recorded under nsys and analysed end to end: `bash run_nsys.sh fsdp --separate-reduce-scatter
-n 8` (the tiny model, one measured step) gives every rank's calls their process group, the reduce-scatters'
own group as the ranges name it, every call paired within its group, and each rank's per-group overlap."""

from __future__ import annotations

import json
import sqlite3
from collections import Counter

import pytest

from analysis.collectives import command as collectives
from analysis.overlap import command as overlap
from tests import small_run
from tests.support.nsys import RECORDS_WITH_NSYS

pytestmark = [*RECORDS_WITH_NSYS, pytest.mark.ranks]
WORLD = 8


@pytest.fixture(scope="module")
def recording(tmp_path_factory):
    out = tmp_path_factory.mktemp("eight")
    extra = ["--separate-reduce-scatter", "-n", str(WORLD), "--model", "tiny"]
    done = small_run.record(["fsdp"], out, 1, 1, *extra, timeout_s=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return out / "fsdp.sqlite"


def raw_reduce_scatters(path) -> Counter:
    """rank -> its `comm:reduce_scatter:<unit>@reduce_scatter` ranges inside its `step` ranges, read from the
    export's NVTX table with plain Python."""
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    rows = con.execute(
        'SELECT (e.globalTid >> 24) & 16777215, COALESCE(e.text, s.value), e.start, e."end" '
        "FROM NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = e.textId"
    ).fetchall()
    rank = {pid: json.loads(t.split(" ", 1)[1])["rank"] for pid, t, *_ in rows if t and t.startswith("ddp.meta ")}
    steps = [(pid, s, e) for pid, t, s, e in rows if t and t.startswith("step ")]
    return Counter(
        rank[pid]
        for pid, t, s, _ in rows
        if t
        and t.startswith("comm:reduce_scatter:")
        and t.endswith("@reduce_scatter")
        and any(p == pid and a <= s <= b for p, a, b in steps)
    )


def test_every_call_pairs_within_its_group_and_each_rank_has_both_groups(recording, capsys):
    assert collectives.main([str(recording), "--format", "json", "--no-cache"]) == 0
    doc = json.loads(capsys.readouterr().out)["traces"][0]
    calls = [c for c in doc["calls"] if c["phase"] != "outside steps"]
    assert doc["world_size"] == doc["ranks"] == WORLD and calls
    assert all(c["paired"] and c["partners"] == WORLD and not c["group_inferred"] for c in calls)
    assert all(c["group"]["ranks"] == list(range(WORLD)) for c in calls)
    named = Counter(c["rank"] for c in calls if c["group"]["name"] == "reduce_scatter")
    assert named == raw_reduce_scatters(recording) and len(named) == WORLD
    assert {c["op"] for c in calls if c["group"]["name"] == "reduce_scatter"} == {"reduce_scatter"}
    assert overlap.main([str(recording), "--format", "json", "--no-cache"]) == 0
    ranks = json.loads(capsys.readouterr().out)["traces"][0]["ranks"]
    assert len(ranks) == WORLD
    for rank in ranks:
        assert sorted(g["group"]["name"] for g in rank["groups"]) == ["default", "reduce_scatter"]
        for g in rank["groups"]:
            assert g["comm_ms"] == pytest.approx(g["overlap_ms"] + g["exposed_comm_ms"], abs=1e-6)
