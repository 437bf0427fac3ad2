"""fsdp's buffer lifetimes against its collectives (docs/fsdp.md, "Streams and buffer lifetimes"): no gathered
storage freed, gradient buffer handed to another unit, cast shard rewritten or reduced gradient read before the
collective using it was waited for, and nothing left in flight at the end of a step; with every setting, and
with works that say they are complete before anyone waited (as `is_completed()` may on CUDA)."""

from __future__ import annotations

import pytest
import torch

from ddp.launch.launcher import launch
from tests.ddp.strategies import fsdp_cases
from tests.ddp.strategies.fsdp_ordering import ordering_worker, violations

STEPS, BATCH, WORLD = 2, 8, 2
CASES = {
    "prefetch1": {"model": "stack", "kwargs": {"prefetch": 1}},
    "prefetch2": {"model": "stack", "kwargs": {"prefetch": 2}},
    "prefetch3": {"model": "stack", "kwargs": {"prefetch": 3}},
    "bf16": {"model": "stack", "kwargs": {"compute_dtype": torch.bfloat16}},
    "host_sees_complete": {"model": "stack", "kwargs": {}, "host_sees_complete": True},
    "dangling": {"model": "dangling", "kwargs": {}},
    "mixed": {"model": "mixed", "kwargs": {}, "host_sees_complete": True},
    "separate_rs": {"model": "stack", "kwargs": {"separate_reduce_scatter": True}, "host_sees_complete": True},
}


# ---- the checker itself, on logs written by hand ---------------------------------------------------------
def _issue(k: int, op: str, reads: tuple[int, int], writes: tuple[int, int]) -> tuple:
    return ("issue", k, [op, [reads], [writes]])


@pytest.mark.parametrize(
    "events, expected",
    [
        ([_issue(0, "reduce_scatter", (100, 64), (900, 32)), ("take", None, [(100, 64)])], 1),  # reused too early
        ([_issue(0, "reduce_scatter", (100, 64), (900, 32)), ("wait", 0, []), ("take", None, [(100, 64)])], 0),
        ([_issue(0, "all_gather", (500, 8), (200, 16)), ("free", None, [(200, 16)]), ("wait", 0, [])], 1),
        ([_issue(0, "all_gather", (500, 8), (200, 16)), ("read", None, [(500, 8)])], 0),  # reading what it reads
        ([_issue(0, "all_gather", (500, 8), (200, 16)), ("write", None, [(504, 8)])], 1),  # overlapping its input
        ([_issue(0, "all_gather", (500, 8), (200, 16)), ("free", None, [(216, 16)])], 0),  # adjacent, not overlapping
        ([_issue(0, "all_gather", (500, 8), (200, 16)), ("step_end", None, [])], 1),
    ],
)
def test_the_checker_flags_an_event_before_the_wait_it_needs(events, expected):
    assert len(violations(events)) == expected


# ---- fsdp's own order, on 2 gloo ranks --------------------------------------------------------------------
@pytest.fixture(scope="module")
def logs() -> dict:
    cases = [{"optimizer": "sgd", "steps": STEPS, "batch_size": BATCH, **case} for case in CASES.values()]
    return dict(zip(CASES, launch(ordering_worker, WORLD, cases, timeout_s=240), strict=True))


@pytest.mark.ranks  # spawns ranks
@pytest.mark.parametrize("case", list(CASES))
def test_no_buffer_is_freed_reused_or_rewritten_before_the_collective_using_it_was_waited(logs, case):
    events = logs[case]["events"]
    assert violations(events) == []
    kinds = [kind for kind, _, _ in events]
    assert kinds.count("step_end") == STEPS and kinds.count("free") > 0 and kinds.count("take") > 0
    # not vacuous: some gradient buffer did go to another unit after a reduce-scatter had read it
    scattered = [s[1][0] for kind, _, s in events if kind == "issue" and s[0] == "reduce_scatter"]
    taken = [s[0] for kind, _, s in events if kind == "take"]
    assert any(t[0] == r[0] for t in taken for r in scattered)


@pytest.mark.ranks
@pytest.mark.parametrize("case", ["host_sees_complete", "dangling", "mixed", "prefetch3", "separate_rs"])
def test_the_logged_runs_still_train_bit_for_bit_like_one_process(logs, case):
    outcome, model = logs[case], CASES[case]["model"]
    reference = fsdp_cases.train_reference(model, "sgd", STEPS, BATCH, WORLD, threads=outcome["threads"])
    for got, want in zip(outcome["history"], reference, strict=True):
        assert all(torch.equal(got[n], v) for n, v in want.items())


@pytest.mark.ranks
@pytest.mark.parametrize("case", ["prefetch2", "separate_rs"])
def test_reduce_scatters_go_through_their_own_group_only_when_asked(logs, case):
    outcome = logs[case]
    ops = [s[0] for kind, _, s in outcome["events"] if kind == "issue"]
    by_op = {op: {g for o, g in zip(ops, outcome["work_groups"], strict=True) if o == op} for op in set(ops)}
    default = outcome["groups"]["default"]
    assert by_op["all_gather"] == {default}
    if case == "separate_rs":
        assert by_op["reduce_scatter"] == {outcome["groups"]["reduce_scatter"]} != {default}
        assert ops.count("reduce_scatter") == STEPS * len(fsdp_cases.Stack().layers) + 2 * STEPS  # + emb, head
    else:
        assert by_op["reduce_scatter"] == {default} and "reduce_scatter" not in outcome["groups"]
