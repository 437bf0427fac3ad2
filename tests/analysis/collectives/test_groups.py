"""Process groups: each call's group, pairing within it and per-group overlap, against a plain-Python computation
from the export's raw tables (HSDP-shaped synthetic exports whose shard and replicate calls interleave, 4 and 64
ranks, each rank its own pace); the outputs show groups only when a run has more than one; torch.profiler's own
records name the groups of someone else's job."""

from __future__ import annotations

import json
import sqlite3
from collections import defaultdict
from pathlib import Path

import pytest

from analysis import analyze_trace
from analysis.collectives import command as collectives
from analysis.collectives.collective_rows import call_rows
from analysis.overlap import command as overlap
from analysis.run.loaded_run import load_trace
from contract import GROUPS_KEY, META_PREFIX, dimension_of, step_range
from tests.support.synthetic_groups import write_hsdp_trace
from tests.support.synthetic_kineto import BASE_TIME_NS, KinetoWriter

NS_PER_MS = 1e6


@pytest.fixture(scope="module")
def hsdp4(tmp_path_factory) -> Path:
    return write_hsdp_trace(tmp_path_factory.mktemp("g") / "hsdp4.sqlite", shard=2, replicas=2, steps=2, calls=3)


@pytest.fixture(scope="module")
def hsdp64(tmp_path_factory) -> Path:
    return write_hsdp_trace(tmp_path_factory.mktemp("g") / "hsdp64.sqlite", shard=8, replicas=8, steps=2, calls=2)


def _pid(global_tid: int) -> int:
    return (global_tid >> 24) & 0xFFFFFF


def raw_calls(path: Path) -> tuple[list[dict], dict[int, list[tuple[int, int]]]]:
    """Every communication kernel as a call (rank, op, group name and members, step, start, end) and each rank's
    compute kernels, read from the export's tables with plain Python."""
    con = sqlite3.connect(path)
    names = dict(con.execute("SELECT id, value FROM StringIds"))
    launch = {
        (_pid(g), c): (s, g)
        for s, c, g in con.execute("SELECT start, correlationId, globalTid FROM CUPTI_ACTIVITY_KIND_RUNTIME")
    }
    nvtx = con.execute("SELECT start, end, text, globalTid FROM NVTX_EVENTS WHERE text IS NOT NULL").fetchall()
    meta = {_pid(g): json.loads(t[len(META_PREFIX) :]) for _, _, t, g in nvtx if t.startswith(META_PREFIX)}
    comm = [(s, e, t, g) for s, e, t, g in nvtx if t.startswith("comm:")]
    steps = [(s, e, int(t.split()[1]), _pid(g)) for s, e, t, g in nvtx if t.startswith("step ")]
    calls, compute = [], defaultdict(list)
    for start, end, corr, name, gpid in con.execute(
        "SELECT start, end, correlationId, shortName, globalPid FROM CUPTI_ACTIVITY_KIND_KERNEL"
    ):
        pid = _pid(gpid)
        rank = meta[pid]["rank"]
        if not names[name].startswith("nccl"):
            compute[rank].append((start, end))
            continue
        t, tid = launch[(pid, corr)]
        opened = [r for r in comm if r[3] == tid and r[0] <= t < r[1]]
        r_start, _, text, _ = max(opened)
        op, rest = text[len("comm:") :].split(":", 1)
        group = rest.split("@")[1]
        members = tuple(meta[pid][GROUPS_KEY][group]["ranks"])
        step = next(n for s, e, n, p in steps if p == pid and s <= r_start <= e)
        calls.append(
            {"rank": rank, "op": op, "group": group, "members": members, "step": step, "start": start, "end": end}
        )
    return calls, compute


def reference_pairing(calls: list[dict]) -> dict[tuple, dict]:
    """(rank, group, op, step, seq) -> wait_ns, last_rank, partners, paired: the k-th call of an op in a step of a
    group on each member is one collective; a member's wait is the last arrival minus its own, within its call."""
    mine = defaultdict(list)
    for c in sorted(calls, key=lambda c: (c["rank"], c["start"])):
        mine[(c["rank"], c["group"], c["members"], c["op"], c["step"])].append(c)
    logical = defaultdict(dict)
    for (rank, group, members, op, step), each in mine.items():
        for seq, c in enumerate(each):
            logical[(group, members, op, step, seq)][rank] = c
    out = {}
    for (group, members, op, step, seq), by_rank in logical.items():
        last = max(c["start"] for c in by_rank.values())
        last_rank = min(r for r, c in by_rank.items() if c["start"] == last)
        paired = len(by_rank) == len(members) >= 2
        for rank, c in by_rank.items():
            wait = min(max(last - c["start"], 0), c["end"] - c["start"])
            out[(rank, group, op, step, seq)] = {
                "wait_ns": wait if paired else None,
                "last_rank": last_rank if paired else -1,
                "partners": len(by_rank),
            }
    return out


def _union(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[list[int]] = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def reference_overlap(calls: list[dict], compute: dict) -> dict[tuple, tuple[int, int, int]]:
    """(rank, group) -> (calls, comm ns: |union of the group's calls|, overlap ns: |that ∩ the rank's compute|)."""
    spans = defaultdict(list)
    for c in calls:
        spans[(c["rank"], c["group"])].append((c["start"], c["end"]))
    out = {}
    for (rank, group), mine in spans.items():
        comm, busy = _union(mine), _union(compute[rank])
        hidden = sum(max(0, min(e, be) - max(s, bs)) for s, e in comm for bs, be in busy)
        out[(rank, group)] = (len(mine), sum(e - s for s, e in comm), hidden)
    return out


def check_against_reference(path: Path) -> None:
    calls, compute = raw_calls(path)
    trace = load_trace(path)
    rows, _ = call_rows(trace)
    expected = reference_pairing(calls)
    assert len(rows) == len(expected) == len(calls)
    for row in rows.itertuples():
        want = expected[(row.rank, row.group, row.op, row.step, row.seq)]
        assert row.partners == want["partners"] and row.last_rank == want["last_rank"]
        assert row.wait_ms * NS_PER_MS == pytest.approx(want["wait_ns"], abs=1e-3)
    groups = analyze_trace(trace).by_group
    want = reference_overlap(calls, compute)
    assert len(groups) == len(want)
    for g in groups.itertuples():
        n, comm, hidden = want[(g.rank, g.group)]
        assert (g.calls, g.comm_ms * NS_PER_MS, g.overlap_ms * NS_PER_MS) == (
            n,
            pytest.approx(comm),
            pytest.approx(hidden),
        )
        assert g.exposed_comm_ms * NS_PER_MS == pytest.approx(comm - hidden)
        members = next(c["members"] for c in calls if c["rank"] == g.rank and c["group"] == g.group)
        assert g.group_ranks == ",".join(map(str, members)) and not g.group_inferred


def test_four_ranks_two_interleaved_groups_pair_and_overlap_as_plain_python(hsdp4):
    check_against_reference(hsdp4)


def test_sixty_four_ranks_every_per_group_figure_is_the_plain_python_one(hsdp64):
    check_against_reference(hsdp64)


def test_pairing_by_op_alone_would_cross_groups(hsdp4):
    """The check above can fail: without groups, the all-reduces of the two replicate groups pair as one pool."""
    calls, _ = raw_calls(hsdp4)
    pooled = reference_pairing([{**c, "group": "", "members": (0, 1, 2, 3)} for c in calls])
    grouped = reference_pairing(calls)
    waits = lambda ref: sorted((k[0], k[2], k[3], k[4], v["wait_ns"]) for k, v in ref.items())
    assert waits(pooled) != waits(grouped)


def test_json_names_each_calls_group_and_each_ranks_groups(hsdp4, capsys):
    assert collectives.main([str(hsdp4), "--format", "json", "--no-cache"]) == 0
    doc = json.loads(capsys.readouterr().out)["traces"][0]
    call = doc["calls"][0]
    assert call["group_inferred"] is False and call["group"]["ranks"] in ([0, 1], [0, 2])
    assert call["group"]["dimension"] == dimension_of(call["group"]["name"]) in ("shard", "replicate")
    assert {g["group"].split()[0] for g in doc["by_group"]} == {"shard", "replicate"}
    assert overlap.main([str(hsdp4), "--format", "json", "--no-cache"]) == 0
    rank0 = json.loads(capsys.readouterr().out)["traces"][0]["ranks"][0]
    assert sorted((g["group"]["name"], g["group"]["ranks"]) for g in rank0["groups"]) == [
        ("replicate", [0, 2]),
        ("shard", [0, 1]),
    ]
    for g in rank0["groups"]:
        assert g["comm_ms"] == pytest.approx(g["overlap_ms"] + g["exposed_comm_ms"])


def test_waits_split_within_and_across_hosts_as_plain_python(hsdp4, capsys):
    """A shard group is one host (node<g>), a replicate group spans hosts: the scopes' wait sums are those of the
    plain-Python pairing, and the table shows the split."""
    calls, _ = raw_calls(hsdp4)
    waits = {"intra-host": 0, "inter-host": 0}
    for (_, group, *_), want in reference_pairing(calls).items():
        waits["intra-host" if group == "shard" else "inter-host"] += want["wait_ns"]
    assert collectives.main([str(hsdp4), "--format", "json", "--no-cache"]) == 0
    doc = json.loads(capsys.readouterr().out)["traces"][0]
    got = {row["host_scope"]: row for row in doc["by_host_scope"]}
    assert set(got) == set(waits)
    for scope, wait in waits.items():
        assert got[scope]["wait_ms"] * NS_PER_MS == pytest.approx(wait, abs=1e-3)
        assert got[scope]["median_busbw_gbps"] > 0
    assert {c["host_scope"] for c in doc["calls"]} == set(waits)
    assert collectives.main([str(hsdp4), "--no-cache", "--summary"]) == 0
    assert "within one host or across hosts" in capsys.readouterr().out


def test_tables_show_groups_only_for_runs_with_several(hsdp4, capsys):
    assert overlap.main([str(hsdp4), "--no-cache"]) == 0
    table = capsys.readouterr().out
    assert "communication by process group" in table and "rank 0: replicate 0,2 x6" in table
    assert collectives.main([str(hsdp4), "--no-cache", "--summary"]) == 0
    assert "by process group" in capsys.readouterr().out


def write_kineto_two_groups(folder: Path) -> list[Path]:
    """Two torch.profiler rank files of one step: all-reduces alternating between a tensor-parallel group ("1",
    mesh_tp) and a data-parallel one ("2", mesh_dp), each inside torch's `record_param_comms` op holding its
    launch, with the group in the op's and the kernel's args as PyTorch writes them. Rank 1 arrives late in the
    tp calls only."""
    paths = []
    for rank in (0, 1):
        pid = 5000 + rank
        w = KinetoWriter(folder / f"tp.rank{rank}.json")
        w.process(pid)
        w.meta_mark(pid, pid, KT0, rank=rank, world_size=2, backend="nccl")
        del w.top["ddp.meta"]  # someone else's job: torch's own records only
        w.nvtx(pid, pid, [KT0], [KT0 + 200_000], step_range(0))
        for i, (name, desc) in enumerate(KINETO_GROUPS * 2):
            issue = KT0 + 20_000 * (i + 1)
            late = 3_000 * rank if desc == "mesh_tp" else 0
            args = {"Collective name": "allreduce", "In msg nelems": 256, "Out msg nelems": 256, "dtype": "Float"}
            args |= {"Process Group Name": name, "Process Group Description": desc, "Process Group Ranks": "[0, 1]"}
            w.cpu_op(pid, pid, issue, issue + 1_000, "record_param_comms", args)
            kernel = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
            w.kernels(
                pid, pid, rank, 20, [issue + 2_000 + late], [issue + 9_000], kernel, launch=[issue + 500], args=args
            )
        paths.append(w.close())
    return paths


KT0 = BASE_TIME_NS + 1_000_000_000
KINETO_GROUPS = [("1", "mesh_tp"), ("2", "mesh_dp")]


def test_torch_profiler_records_name_each_calls_group_and_the_calls_pair_within_it(tmp_path):
    rows, _ = call_rows(load_trace(write_kineto_two_groups(tmp_path)))
    assert len(rows) == 8 and rows["paired"].all() and not rows["group_inferred"].any()
    assert set(zip(rows["group"], rows["group_desc"], rows["group_ranks"], strict=True)) == {
        ("1", "mesh_tp", "0,1"),
        ("2", "mesh_dp", "0,1"),
    }
    assert {dimension_of(n, d) for n, d in KINETO_GROUPS} == {"tp", "dp"}
    for row in rows.itertuples():  # rank 0 waits 3 us for rank 1 in the tp calls, nobody in the dp calls
        assert row.wait_ms * NS_PER_MS == (3_000 if row.group_desc == "mesh_tp" and row.rank == 0 else 0)
        assert row.seq in (0, 1)  # the k-th call of its group: two per group and rank
