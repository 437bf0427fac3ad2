"""An inferred call (a communication kernel outside every comm range: a closing barrier) folds into the named group
of every rank, so a run with one real group shows one group; real groups (HSDP's shard and replicate) stay apart.
Figures against plain Python over the export's raw tables."""

from __future__ import annotations

import json
import sqlite3
from collections import defaultdict
from pathlib import Path

import pandas as pd
import pytest

from analysis import analyze_trace
from analysis.collectives import command as collectives
from analysis.collectives.collective_rows import call_rows
from analysis.measure.call_groups import FOLDED, fold_inferred
from analysis.overlap import command as overlap
from analysis.run.loaded_run import load_trace
from contract import META_PREFIX
from tests.support.synthetic_groups import write_hsdp_trace

NS_PER_MS = 1e6


@pytest.fixture(scope="module")
def one_group(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("f") / "one.sqlite"
    return write_hsdp_trace(path, shard=2, replicas=2, steps=2, calls=2, grouped=False, barrier=True)


@pytest.fixture(scope="module")
def two_groups(tmp_path_factory) -> Path:
    return write_hsdp_trace(tmp_path_factory.mktemp("f") / "two.sqlite", steps=2, calls=2, barrier=True)


def raw_comm(path: Path) -> tuple[dict, dict, dict]:
    """Per rank, read with plain Python: its communication kernels (start, end, launch inside a comm range), its
    compute kernels (start, end)."""
    con = sqlite3.connect(path)
    names = dict(con.execute("SELECT id, value FROM StringIds"))
    launch = {
        c: (s, g) for s, c, g in con.execute("SELECT start, correlationId, globalTid FROM CUPTI_ACTIVITY_KIND_RUNTIME")
    }
    nvtx = con.execute("SELECT start, end, text, globalTid FROM NVTX_EVENTS WHERE text IS NOT NULL").fetchall()
    rank_of = {
        g >> 24 & 0xFFFFFF: json.loads(t[len(META_PREFIX) :])["rank"]
        for _, _, t, g in nvtx
        if t.startswith(META_PREFIX)
    }
    ranges = [(s, e, g) for s, e, t, g in nvtx if t.startswith("comm:")]
    comm, compute, ranged = defaultdict(list), defaultdict(list), defaultdict(list)
    kernels = "SELECT start, end, correlationId, shortName, globalPid FROM CUPTI_ACTIVITY_KIND_KERNEL"
    for start, end, corr, name, gpid in con.execute(kernels):
        rank = rank_of[gpid >> 24 & 0xFFFFFF]
        if not names[name].startswith("nccl"):
            compute[rank].append((start, end))
            continue
        t, tid = launch[corr]
        comm[rank].append((start, end))
        ranged[rank].append(any(g == tid and s <= t < e for s, e, g in ranges))
    return comm, compute, ranged


def _union(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[list[int]] = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def _hidden(comm: list[tuple[int, int]], compute: list[tuple[int, int]]) -> int:
    return sum(max(0, min(e, f) - max(s, c)) for s, e in _union(comm) for c, f in _union(compute))


def test_a_barrier_outside_the_ranges_joins_the_one_real_group(one_group, capsys):
    comm, compute, ranged = raw_comm(one_group)
    assert all(r.count(False) == 1 for r in ranged.values())  # one kernel per rank outside every comm range
    groups = analyze_trace(load_trace(one_group)).by_group
    assert list(groups["rank"]) == sorted(comm) and set(groups["label"]) == {"default all"}
    for g in groups.itertuples():
        mine = comm[g.rank]
        assert (g.calls, g.folded_calls, g.group_inferred) == (len(mine), 1, False)
        assert g.comm_ms * NS_PER_MS == pytest.approx(sum(e - s for s, e in _union(mine)))
        assert g.overlap_ms * NS_PER_MS == pytest.approx(_hidden(mine, compute[g.rank]))
    # the barrier pairs across every rank, its last arrival the plain-Python one
    rows, _ = call_rows(load_trace(one_group))
    barrier = rows[rows[FOLDED]]
    starts = {r: min(s for (s, _), inside in zip(comm[r], ranged[r], strict=True) if not inside) for r in comm}
    assert len(barrier) == len(comm) and barrier["paired"].all() and (barrier["partners"] == len(comm)).all()
    assert set(barrier["last_rank"]) == {max(starts, key=lambda r: starts[r])}
    # the outputs show no group section; the JSON says what was folded
    assert overlap.main([str(one_group), "--no-cache"]) == 0
    assert "by process group" not in capsys.readouterr().out
    assert collectives.main([str(one_group), "--no-cache", "--format", "csv"]) == 0
    header = capsys.readouterr().out.splitlines()[0].split(",")
    assert not {"group", "group_inferred", FOLDED} & set(header)
    assert collectives.main([str(one_group), "--no-cache", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)["traces"][0]
    into = {"name": "default", "description": "", "ranks": [0, 1, 2, 3], "dimension": None}
    assert doc["groups_folded"] == [{"into": into, "calls": 4, "ranks": [0, 1, 2, 3], "ops": ["all_reduce"]}]
    assert [g["group"] for g in doc["by_group"]] == ["default all"]


def test_real_groups_stay_apart_and_nothing_folds_without_a_group_of_every_rank(two_groups, capsys):
    _, _, ranged = raw_comm(two_groups)
    groups = analyze_trace(load_trace(two_groups)).by_group
    assert set(groups["label"]) == {"(inferred) all", "shard 0,1", "shard 2,3", "replicate 0,2", "replicate 1,3"}
    assert (groups["folded_calls"] == 0).all()
    inferred = groups[groups["group_inferred"].astype(bool)]
    assert dict(zip(inferred["rank"], inferred["calls"], strict=True)) == {r: v.count(False) for r, v in ranged.items()}
    assert collectives.main([str(two_groups), "--no-cache", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["traces"][0]["groups_folded"] == []


def _frame(*groups: tuple[str, str, bool]) -> pd.DataFrame:
    return pd.DataFrame(
        [(name, "", ranks, inferred) for name, ranks, inferred in groups],
        columns=["group", "group_desc", "group_ranks", "group_inferred"],
    )


@pytest.mark.parametrize(
    ("named", "into"),
    [
        ([("default", "", False), ("reduce_scatter", "0,1", False)], "default"),  # the default group first
        ([("reduce_scatter", "0,1", False), ("shard", "0", False)], "reduce_scatter"),  # the one group of every rank
        ([("a", "0,1", False), ("b", "0,1", False)], None),  # two of them: which one is unknown
        ([("shard", "0", False)], None),  # none of every rank
    ],
)
def test_which_group_an_inferred_call_folds_into(named, into):
    out = fold_inferred(_frame(*named, ("", "", True)), world=2)
    last = out.iloc[-1]
    if into is None:
        assert bool(last["group_inferred"]) and not last[FOLDED] and last["group"] == ""
    else:
        assert not last["group_inferred"] and last[FOLDED] and last["group"] == into
    assert not out[FOLDED].iloc[:-1].any() and out.iloc[:-1].equals(_frame(*named).assign(**{FOLDED: False}))
