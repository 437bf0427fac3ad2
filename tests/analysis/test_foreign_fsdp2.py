"""PyTorch FSDP2 recorded with plain torch.profiler (scripts/record_torch_fsdp2.py: none of our code, no
contract ranges) and analysed: by_op_phase per rank and step equals a plain-Python computation from the
raw JSON events."""

from __future__ import annotations

import json
import re
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from analysis import analyze
from tests.support import owned

REPO = Path(__file__).resolve().parents[2]
LAYERS = 2  # fully_shard groups: 2 per layer (up, down), the head, the root
GROUPS = 2 * LAYERS + 2


@pytest.fixture(scope="module")
def fsdp2_traces(tmp_path_factory) -> list[Path]:
    out = tmp_path_factory.mktemp("fsdp2")
    cmd = [sys.executable, "-W", "ignore", str(REPO / "scripts/record_torch_fsdp2.py"), "--profiler", "torch"]
    cmd += ["-o", str(out), "--steps", "4", "--layers", str(LAYERS)]
    done = owned.run(cmd, capture_output=True, text=True, timeout=400, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    return [out / "fsdp2.rank0.json", out / "fsdp2.rank1.json"]


def _union(intervals):
    out: list[list[int]] = []
    for s, e in sorted(intervals):
        if e <= s:
            continue
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


def _length(intervals):
    return sum(e - s for s, e in _union(intervals))


def _overlap(a, b):
    return sum(max(0, min(e1, e2) - max(s1, s2)) for s1, e1 in _union(a) for s2, e2 in _union(b))


def _minus(a, b):
    """a minus b, as intervals."""
    out = []
    for s, e in _union(a):
        cuts = [(max(s, bs), min(e, be)) for bs, be in _union(b) if bs < e and be > s]
        at = s
        for cs, ce in cuts:
            out.append((at, cs))
            at = ce
        out.append((at, e))
    return [(s, e) for s, e in out if e > s]


def reference(path: Path) -> dict:
    """(step, op, phase) -> [calls, comm ns, hidden ns] straight from the JSON events, by the documented
    rules: calls = gloo annotations (all_reduce inside FSDP::post_backward_reduce is the reduce-scatter);
    phase = the FSDP2 marker open at the call's start; compute = each step's autograd span (first to
    last `autograd::engine` op) minus FSDP2's waits (FSDP::all_gather, post_backward_reduce, rs_wait)."""
    events = [e for e in json.loads(path.read_text())["traceEvents"] if e.get("ph") == "X"]
    ns = lambda e: (round(e["ts"] * 1000), round(e["ts"] * 1000) + round(e["dur"] * 1000))
    steps = [(*ns(e), int(e["name"].split("#")[1])) for e in events if e["name"].startswith("ProfilerStep#")]
    named = lambda regex: [ns(e) for e in events if re.match(regex, e["name"])]
    waits = named(r"FSDP::(all_gather|post_backward_reduce|post_backward_rs_wait)\b")
    compute = []
    for s, e, _ in steps:
        autograd = [ns(x) for x in events if x["name"].startswith("autograd::engine") and s <= ns(x)[0] < e]
        if autograd:
            compute.append((min(a for a, _ in autograd), max(b for _, b in autograd)))
    compute = _minus(compute, waits)
    reduce = named(r"FSDP::post_backward_reduce\b")
    markers = [
        (r"FSDP::(root_pre_forward|pre_forward|post_forward|forward_prefetch)\b", "forward"),
        (r"FSDP::(pre_backward|post_backward_\w+|backward_prefetch)\b", "backward"),
        (r"FSDP::root_post_backward_callback\b", "after backward"),
    ]
    out: dict = defaultdict(lambda: [0, [], 0])
    for e in events:
        found = re.match(r"^(gloo|nccl):(\w+)$", e["name"])
        if not found:
            continue
        s, end = ns(e)
        op = found.group(2)
        if op == "all_reduce" and any(a <= s < b for a, b in reduce):
            op = "reduce_scatter"
        step = next((n for a, b, n in steps if a <= s < b), -1)
        phase = "other" if step >= 0 else "outside steps"
        for regex, name in markers:
            if any(a <= s < b for a, b in named(regex)):
                phase = name
        out[(step, op, phase)][0] += 1
        out[(step, op, phase)][1].append((s, end))
    return {k: (v[0], _length(v[1]), _overlap(v[1], compute)) for k, v in out.items()}


@pytest.mark.ranks
def test_by_op_phase_of_a_foreign_fsdp2_trace_equals_a_plain_python_computation(fsdp2_traces):
    result = analyze(fsdp2_traces, merge=True)
    rows = result.by_op_phase
    for rank, path in enumerate(fsdp2_traces):
        expected = reference(path)
        mine = rows[(rows["rank"] == rank) & rows["step"].notna()]
        got = {
            (int(r.step), r.op, r.phase): (r.calls, round(r.comm_ms * 1e6), round(r.hidden_ms * 1e6))
            for r in mine.itertuples()
        }
        kept = {k: v for k, v in expected.items() if k[0] in {int(s) for s in mine["step"]}}
        assert got == kept
        for step in {k[0] for k in got}:
            # every group gathers its weights in forward; all but the root (kept after forward) again in
            # backward; every group reduce-scatters its gradients once (the root's in the final callback)
            calls = {(op, phase): c for (s, op, phase), (c, _, _) in got.items() if s == step}
            assert calls[("all_gather", "forward")] == GROUPS
            assert calls[("all_gather", "backward")] == GROUPS - 1
            assert calls[("reduce_scatter", "backward")] + calls.get(("reduce_scatter", "after backward"), 0) == GROUPS
    assert (abs(rows["hidden_ms"] + rows["exposed_ms"] - rows["comm_ms"]) < 1e-9).all()
