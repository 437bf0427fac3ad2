"""A sharded strategy recorded on 2 gloo ranks under the real nsys (`run_nsys.sh`), analysed by
`analysis.overlap --format json`, checked against plain Python over the raw SQLite tables:

- per rank and step, the forward all-gathers carry exactly the sharded parameters' bytes that `ddp.meta`
  lists, and so do the backward reduce-scatters;
- every `by_op_phase` row (calls, bytes, comm, hidden, exposed) equals a computation written here from
  NVTX_EVENTS alone;
- hidden + exposed = comm in every row, per step and over the capture.
"""

from __future__ import annotations

import contextlib
import io
import json
import sqlite3
from collections import defaultdict
from pathlib import Path

import pytest

from analysis.overlap import command as overlap_cli
from ddp.strategies.registry import HYBRID, IMPLEMENTATIONS, SHARDED
from ddp.training.models import build_model
from tests.support.nsys import RECORDS_WITH_NSYS
from tests.support.recordings import STEPS

pytestmark = RECORDS_WITH_NSYS
# fsdp first, when it is registered; hsdp and torch_hsdp on 2 ranks are these on one replica (their recording:
# tests/analysis/collectives/test_hsdp_recording.py)
IMPLS = [name for name in SHARDED if name in IMPLEMENTATIONS and name not in HYBRID]
MARK, PUSH_POP, START_END = 34, 59, 60  # NVTX_EVENTS.eventType
ROWS = """
SELECT (e.globalTid >> 24) & 16777215, e.eventType, COALESCE(e.text, s.value), e.start, e."end", e.int64Value
FROM NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = e.textId
WHERE e.eventType IN (34, 59, 60)
"""
PHASES = {"forward": "forward", "backward": "backward", "optimizer": "optimizer"}


@pytest.fixture(scope="module", params=IMPLS)
def recorded(request, nsys_recordings) -> tuple[dict, dict]:
    """(raw NVTX rows by rank with each rank's ddp.meta, the analysis' JSON) of one recorded run."""
    impl = request.param
    sqlite = nsys_recordings(impl) / f"{impl}.sqlite"
    with contextlib.redirect_stdout(io.StringIO()) as printed:  # `python -m analysis.overlap`, in this process
        assert overlap_cli.main([str(sqlite), "--format", "json"]) == 0
    return raw_by_rank(sqlite), json.loads(printed.getvalue())["traces"][0]


def raw_by_rank(sqlite: Path) -> dict[int, dict]:
    con = sqlite3.connect(f"file:{sqlite}?mode=ro", uri=True)
    rows = con.execute(ROWS).fetchall()
    con.close()
    metas = {r[0]: json.loads(r[2].split(" ", 1)[1]) for r in rows if r[1] == MARK and r[2].startswith("ddp.meta ")}
    return {meta["rank"]: {"meta": meta, "rows": [r for r in rows if r[0] == pid]} for pid, meta in metas.items()}


# ---- plain interval arithmetic on lists of (start, end) ---------------------------------------------
def union(pieces):
    out = []
    for s, e in sorted(pieces):
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        elif e > s:
            out.append((s, e))
    return out


def subtract(pieces, removed):
    out = []
    for s, e in union(pieces):
        cur = s
        for rs, re_ in union(removed):
            if re_ <= cur or rs >= e:
                continue
            if rs > cur:
                out.append((cur, rs))
            cur = max(cur, re_)
        if cur < e:
            out.append((cur, e))
    return out


def length(pieces):
    return sum(e - s for s, e in union(pieces))


def overlap(a, b):
    return sum(max(0, min(e1, e2) - max(s1, s2)) for s1, e1 in union(a) for s2, e2 in union(b))


def expected_rows(rank_rows: list[tuple]) -> dict[tuple[int, str, str], dict]:
    """(step, op, phase) -> calls, bytes, comm_ms, hidden_ms from one rank's NVTX rows, as the analysis
    defines them (analysis/measure/comm_breakdown.py): a call is a `comm:<op>:<tag>` range; its step and phase
    are the `step N` and forward/backward/optimizer ranges holding its start (`grad_sync`: after
    backward); compute is the phase ranges less blocking (push/pop) comm ranges, `grad_sync` and
    `comm_wait:<op>:<tag>` ranges."""
    ranges = [(kind, name, s, e, payload) for _, kind, name, s, e, payload in rank_rows if kind != MARK]
    steps = [(int(name.split()[1]), s, e) for kind, name, s, e, _ in ranges if name.startswith("step ")]
    phases = [(PHASES[name], s, e) for kind, name, s, e, _ in ranges if name in PHASES]
    syncs = [(s, e) for kind, name, s, e, _ in ranges if name == "grad_sync"]
    waits = [(s, e) for kind, name, s, e, _ in ranges if name.startswith("comm_wait:")]  # fsdp's gather waits
    comm = [(name, kind, s, e, payload) for kind, name, s, e, payload in ranges if name.startswith("comm:")]
    blocking = [(s, e) for _, kind, s, e, _ in comm if kind == PUSH_POP]
    compute = subtract([(s, e) for _, s, e in phases], blocking + syncs + waits)
    groups: dict[tuple[int, str, str], list] = defaultdict(list)
    for name, _, s, e, payload in comm:
        step = next((n for n, ss, se in steps if ss <= s < se), None)
        if step is None:
            continue  # outside the measured steps (the broadcast at construction is not captured anyway)
        if any(ss <= s < se for ss, se in syncs):
            phase = "after backward"
        else:
            phase = next((p for p, ps, pe in phases if ps <= s < pe), "other")
        groups[(step, name.split(":")[1], phase)].append((s, e, payload))
    return {
        key: {
            "calls": len(calls),
            "bytes": float(sum(p for _, _, p in calls)),
            "comm_ms": length([(s, e) for s, e, _ in calls]) / 1e6,
            "hidden_ms": overlap([(s, e) for s, e, _ in calls], compute) / 1e6,
        }
        for key, calls in groups.items()
    }


def analysed_rows(rank: dict) -> dict[tuple[int, str, str], dict]:
    return {(step["step"], r["op"], r["phase"]): r for step in rank["steps"] for r in step["by_op_phase"]}


def test_gathers_in_forward_and_scatters_in_backward_carry_the_sharded_bytes_every_step(recorded):
    raw, analysis = recorded
    for rank in analysis["ranks"]:
        meta = raw[rank["rank"]]["meta"]
        sharded = meta["sharded"]
        param_bytes = 4 * sum(e["numel"] for e in sharded)  # the sharded parameters in full, float32
        assert sum(e["all_gather_bytes"] for e in sharded) == param_bytes  # the tiny model's rows split evenly
        # the same names and sizes in the model built here
        model = dict(build_model("tiny").named_parameters())
        assert param_bytes == sum(4 * model[n].numel() for e in sharded for n in e["params"])
        assert len(rank["steps"]) == STEPS
        for step in rank["steps"]:
            rows = {(r["op"], r["phase"]): r for r in step["by_op_phase"]}
            assert rows[("all_gather", "forward")]["bytes"] == param_bytes
            assert rows[("reduce_scatter", "backward")]["bytes"] == param_bytes
            assert (
                rows[("all_gather", "forward")]["calls"]
                == rows[("reduce_scatter", "backward")]["calls"]
                == len(sharded)
            )


def test_by_op_phase_equals_a_computation_from_the_raw_tables(recorded):
    raw, analysis = recorded
    for rank in analysis["ranks"]:
        expected = expected_rows(raw[rank["rank"]]["rows"])
        got = analysed_rows(rank)
        assert got.keys() == expected.keys()
        for key, want in expected.items():
            row = got[key]
            assert (row["calls"], row["bytes"]) == (want["calls"], want["bytes"]), key
            assert row["comm_ms"] == pytest.approx(want["comm_ms"], abs=1e-6), key
            assert row["hidden_ms"] == pytest.approx(want["hidden_ms"], abs=1e-6), key


def test_hidden_plus_exposed_is_comm_in_every_row(recorded):
    _, analysis = recorded
    rows = [r for rank in analysis["ranks"] for step in rank["steps"] for r in step["by_op_phase"]]
    rows += [r for rank in analysis["ranks"] for r in rank["total"]["by_op_phase"]]
    assert rows
    for r in rows:
        assert r["hidden_ms"] + r["exposed_ms"] == pytest.approx(r["comm_ms"], abs=1e-9)
        assert 0 <= r["hidden_ms"] <= r["comm_ms"] + 1e-9
