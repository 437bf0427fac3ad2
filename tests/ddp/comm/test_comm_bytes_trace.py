"""A real nsys trace on CPU carries each collective's byte count as the integer payload of its
`comm:all_reduce:<tag>` range (NVTX_EVENTS.int64Value), and ddp.meta the bucket layout; per rank
and step the bytes add up to the model's gradient bytes (plus the "had a gradient" flags)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from tests.support.nsys import RECORDS_WITH_NSYS
from tests.support.recordings import STEPS

REPO = Path(__file__).resolve().parents[3]
pytestmark = RECORDS_WITH_NSYS

# Our wrappers' buckets with their flags (overlap_bucket: several) and torch's own (no flags). The real nsys
# path of a payload is the same for every implementation; each one's payloads and layout, flat's single "flat"
# bucket among them, are tested in-process: tests/ddp/comm/test_nvtx_ranges.py (one recording fewer).
IMPLS = ("overlap_bucket", "torch")

ROWS = """
SELECT (e.globalTid >> 24) & 16777215 AS pid, COALESCE(e.text, s.value) AS name, e.start, e."end",
       e.int64Value AS payload
FROM NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = e.textId
WHERE e.eventType IN (34, 59, 60)
"""


@pytest.fixture(scope="module")
def traces(nsys_recordings) -> Path:
    return nsys_recordings(*IMPLS)  # after warm-up steps enough for torch's buckets to be final


def gradient_bytes() -> tuple[int, list[str]]:
    """Float32 bytes of the tiny model's trainable parameters, and their names (written here, not by ddp)."""
    from ddp.training.models import build_model

    named = [(n, p) for n, p in build_model("tiny", 64).named_parameters() if p.requires_grad]
    return sum(p.numel() * 4 for _, p in named), [n for n, _ in named]


@pytest.mark.parametrize("impl", IMPLS)
def test_each_steps_collectives_carry_the_gradient_bytes(traces, impl):
    con = sqlite3.connect(f"file:{traces / f'{impl}.sqlite'}?mode=ro", uri=True)
    rows = con.execute(ROWS).fetchall()
    con.close()
    grad_bytes, names = gradient_bytes()
    flags = 0 if impl == "torch" else 4 * len(names)  # one float32 flag per parameter in our wrappers
    metas = {pid: json.loads(name.split(" ", 1)[1]) for pid, name, *_ in rows if name.startswith("ddp.meta ")}
    assert sorted(m["rank"] for m in metas.values()) == [0, 1]
    for pid, meta in metas.items():
        buckets = meta["buckets"]
        assert sorted(n for b in buckets for n in b["params"]) == sorted(names)
        assert sum(b["bytes"] for b in buckets) == grad_bytes + flags
        assert [b["name"] for b in buckets] == [f"bucket{i}" for i in range(len(buckets))]
        layout = {b["name"]: b["bytes"] for b in buckets}
        steps = [(s, e) for p, name, s, e, _ in rows if p == pid and name.startswith("step ")]
        assert len(steps) == STEPS
        comm = [
            (s, name, payload) for p, name, s, _, payload in rows if p == pid and name.startswith("comm:all_reduce:")
        ]
        for start, end in steps:
            in_step = [(name, payload) for s, name, payload in comm if start <= s <= end]
            assert sum(payload for _, payload in in_step) == grad_bytes + flags, (meta["rank"], in_step)
            for name, payload in in_step:  # each range's payload is its bucket's bytes in ddp.meta
                assert payload == layout[name.removeprefix("comm:all_reduce:")]
        assert len(comm) == STEPS * len(buckets)
