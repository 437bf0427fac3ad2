"""analysis.advise on a synthetic sharded (fsdp) CPU run whose answer is worked out by hand, and the
refusal of runs advise does not model (the keep rule: tests/analysis/advise/test_uncertainty.py)."""

from __future__ import annotations

import json

import pytest

from analysis.advise.advice import advise
from analysis.advise.sharded.result import table_lines
from analysis.errors import TraceError
from contract import (
    ALL_GATHER,
    BACKWARD,
    FORWARD,
    GRAD_SYNC,
    OPTIMIZER,
    PROFILE,
    REDUCE_SCATTER,
    comm_range,
    comm_wait_range,
    step_range,
)
from tests.analysis.advise.test_advice import advise_cli
from tests.support.synthetic import PUSH_POP, START_END, NsysWriter

MS = 1_000_000
UNITS = ["l0", "l1", "l2", "l3"]
GATHER_BYTES, SCATTER_BYTES = 1 << 20, 2 << 20
STEP, STEPS = 101, 3
# fsdp at prefetch 2 with one collective at a time on one group (NCCL's rule): gathers 4 ms, reduce-scatters 8 ms,
# units 10 ms, 4 ms of compute before each phase's first unit; worked by hand (sharded/test_replay.py's second case):
# op, unit, issue, end (ms from the step's start); the waits: unit, need, resume
CALLS = [
    (ALL_GATHER, "l0", 0, 4), (ALL_GATHER, "l1", 0, 8), (ALL_GATHER, "l2", 14, 18), (ALL_GATHER, "l3", 24, 28),
    # backward from 44: l3 and l2 issued at its start; each unit's post-hook issues its reduce-scatter, then
    # the gather two units on, which queues behind it
    (ALL_GATHER, "l3", 44, 48), (ALL_GATHER, "l2", 44, 52),
    (REDUCE_SCATTER, "l3", 58, 66), (ALL_GATHER, "l1", 58, 70),
    (REDUCE_SCATTER, "l2", 68, 78), (ALL_GATHER, "l0", 68, 82),
    (REDUCE_SCATTER, "l1", 80, 90), (REDUCE_SCATTER, "l0", 92, 100),
]  # fmt: skip
WAITS = [("l0", 4, 4), ("l1", 14, 14), ("l2", 24, 24), ("l3", 34, 34),
         ("l3", 48, 48), ("l2", 58, 58), ("l1", 68, 70), ("l0", 80, 82)]  # fmt: skip
FORWARD_AT, BACKWARD_AT, SYNC_AT, OPT_AT = (0, 44), (44, 92), (92, 100), (100, 101)


def write_fsdp_run(
    path, backend: str = "nccl", calls: list | None = None, *, impl: str = "fsdp", prefetch: int = 2,
    waits: list | None = None, phases: tuple = (FORWARD_AT, BACKWARD_AT, SYNC_AT, OPT_AT), step: int = STEP,
) -> None:  # fmt: skip
    """Two identical CPU ranks, STEPS steps of the schedule above (or of `calls`, `waits`, `phases`, `step`
    ms); ddp.meta says `impl`, prefetch `prefetch`, shared."""
    w = NsysWriter(path, cupti=False)
    meta = {
        "implementation": impl, "world_size": 2, "backend": backend, "model": "synthetic",
        "sharding": {"prefetch": prefetch, "separate_reduce_scatter": False},
    }  # fmt: skip
    for rank, pid in enumerate((101, 102)):
        w.process(pid)
        w.nvtx(pid, pid, 0, (STEPS * STEP + 2) * MS, PROFILE, kind=PUSH_POP)
        w.meta_mark(pid, pid, 10, rank=rank, **meta)
        for s in range(STEPS):
            t0 = (1 + s * step) * MS
            at = lambda ms, t0=t0: t0 + int(ms * MS)
            w.nvtx(pid, pid, at(0), at(step), step_range(s), kind=PUSH_POP)
            for name, (lo, hi) in zip((FORWARD, BACKWARD, GRAD_SYNC, OPTIMIZER), phases, strict=True):
                w.nvtx(pid, pid, at(lo), at(hi), name, kind=PUSH_POP)
            for op, unit, issue, end in calls or CALLS:
                size = GATHER_BYTES if op == ALL_GATHER else SCATTER_BYTES
                w.nvtx(pid, pid, at(issue), at(end), comm_range(op, unit), kind=START_END, payload=size)
            for unit, need, resume in WAITS if waits is None else waits:
                w.nvtx(pid, pid, at(need), at(resume), comm_wait_range(ALL_GATHER, unit), kind=PUSH_POP)
    w.close()


@pytest.fixture(scope="module")
def fsdp_run(tmp_path_factory):
    path = tmp_path_factory.mktemp("shard_advise") / "fsdp.sqlite"
    write_fsdp_run(path)
    return path


def candidate(run: dict, prefetch: int, separate: bool) -> dict:
    return next(
        c for c in run["candidates"] if c["setting"] == {"prefetch": prefetch, "separate_reduce_scatter": separate}
    )


def test_the_recorded_setting_replays_the_recorded_step(fsdp_run):
    (a,) = advise([fsdp_run])
    run = a.to_json()
    assert run["recorded_setting"] == {"prefetch": 2, "separate_reduce_scatter": False}
    assert run["recorded_setting_source"] == "ddp.meta" and run["lanes"] == 1 and run["units"] == 4
    assert run["measured_step_ms"] == pytest.approx(STEP) and run["replayed_step_ms"] == pytest.approx(STEP)
    own = candidate(run, 2, False)
    assert own["recorded"] and own["predicted_step_ms"] == pytest.approx(STEP)
    # the recorded waits: l1 and l0 in backward, 2 ms each, per rank-step
    assert own["predicted_forward_wait_ms"] == 0 and own["predicted_backward_wait_ms"] == pytest.approx(4)
    assert run["comm_cost"]["all_gather"]["calls"] == 2 * STEPS * 8


# FSDP2 on CPU, prefetch 1: each gather (4 ms) blocks compute from its unit's need, no wait marked; units 10 ms;
# backward's reduce-scatters (8 ms) share the group, one collective at a time, so the gather issued after one
# queues behind it: l2 waits 70-82, l1 92-104, l0 114-126 (12 ms each, 4 of them its own gather)
SYNC_CALLS = [
    (ALL_GATHER, "l0", 0, 4), (ALL_GATHER, "l1", 14, 18), (ALL_GATHER, "l2", 28, 32), (ALL_GATHER, "l3", 42, 46),
    (ALL_GATHER, "l3", 56, 60), (REDUCE_SCATTER, "l3", 70, 78), (ALL_GATHER, "l2", 70, 82),
    (REDUCE_SCATTER, "l2", 92, 100), (ALL_GATHER, "l1", 92, 104),
    (REDUCE_SCATTER, "l1", 114, 122), (ALL_GATHER, "l0", 114, 126), (REDUCE_SCATTER, "l0", 136, 144),
]  # fmt: skip
SYNC_STEP, SYNC_PHASES = 145, ((0, 56), (56, 136), (136, 144), (144, 145))


def test_gathers_that_block_compute_are_replayed_where_their_unit_needs_them(tmp_path):
    """No depth changes the schedule (each gather is issued at its need, whatever the prefetch); separate
    reduce-scatters let the gathers of l2, l1 and l0 start at once: 8 ms less each, 24 per step."""
    path = tmp_path / "torch_fsdp.sqlite"
    write_fsdp_run(path, "nccl", SYNC_CALLS, impl="torch_fsdp", prefetch=1, waits=[], phases=SYNC_PHASES,
                   step=SYNC_STEP)  # fmt: skip
    run = advise([path])[0].to_json()
    assert run["gathers_block"] and run["replay_within"]
    assert run["replayed_step_ms"] == pytest.approx(SYNC_STEP)
    own = candidate(run, 1, False)
    assert own["predicted_forward_wait_ms"] == pytest.approx(16)  # 4 gathers of 4 ms
    assert own["predicted_backward_wait_ms"] == pytest.approx(4 + 3 * 12)
    for prefetch in (2, 3, 4):
        assert candidate(run, prefetch, False)["predicted_step_ms"] == pytest.approx(SYNC_STEP)
        assert candidate(run, prefetch, True)["predicted_step_ms"] == pytest.approx(SYNC_STEP - 24)
    assert len(own["same_schedule"]) == 4  # depths 1-4, shared
    assert "all-gathers block compute" in "\n".join(table_lines(run))


def test_separate_reduce_scatters_remove_the_backward_waits_worked_by_hand(fsdp_run):
    """Separate: the gathers of l1 and l0 run beside the reduce-scatters (58-62, 68-72) and arrive
    before their units need them: 4 ms less per step (sharded/test_replay.py's second case)."""
    run = advise([fsdp_run])[0].to_json()
    sep = candidate(run, 2, True)
    assert sep["predicted_step_ms"] == pytest.approx(STEP - 4) and sep["predicted_backward_wait_ms"] == 0
    assert sep["predicted_step_ms_err"] == 0  # every step alike: no spread
    # depth 1: every gather is issued when the unit before it ends, and waits for the collectives ahead
    assert candidate(run, 1, False)["predicted_step_ms"] > STEP
    rec = run["recommended"]
    assert rec["setting"] == {"prefetch": 2, "separate_reduce_scatter": True} and not rec["kept"]
    assert rec["gain_ms"] == pytest.approx(4) and rec["gain_ms_err"] == 0


def test_the_cli_prints_the_candidates_and_the_recommendation(fsdp_run, capsys):
    res = advise_cli(capsys, str(fsdp_run), "--prefetch", "1", "2")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert "prefetch 2, reduce-scatters shared (ddp.meta)" in lines[0]
    assert len([ln for ln in lines if ln.strip().startswith(("1 ", "2 "))]) == 4
    assert lines[-1].startswith("recommended: prefetch 2, reduce-scatters separate (4.000 ± 0.000 ms faster")
    data = json.loads(advise_cli(capsys, str(fsdp_run), "--format", "json").stdout)["runs"][0]
    keys = {"setting", "prefetch", "separate_reduce_scatter", "recorded", "predicted_step_ms", "predicted_step_ms_err"}
    assert keys <= set(data["candidates"][0]) and len(data["candidates"]) == 8
    assert advise_cli(capsys, str(fsdp_run), "--bucket-mb", "5").returncode == 2


def test_on_gloo_a_reduce_scatter_costs_two_all_gathers_of_its_bytes(tmp_path):
    """gloo's reduce-scatter is an all-reduce whose range ends at fsdp's wait, not at its completion: the
    replay prices it as two all-gathers of its bytes, from the gathers' own service times (two at once per
    rank: a call starts at the later of its issue and the end of the call two before it on the group; calls in
    service at once share it)."""
    import itertools
    import statistics

    import numpy as np

    from analysis.advise.sharded.predict import shard_run
    from analysis.advise.sharded.recorded import recorded_shard
    from analysis.api import open_runs

    write_fsdp_run(tmp_path / "gloo.sqlite", backend="gloo")
    rec = recorded_shard(open_runs([tmp_path / "gloo.sqlite"]).loaded(0), "fsdp")
    run, costs, _ = shard_run(rec, np.arange(STEPS)[None, :])
    # plain Python: each gather's service on the one group, from the raw schedule (both ranks alike: no wait)
    calls = sorted(CALLS, key=lambda c: c[2])
    windows = []
    for k, (op, _unit, issue, end) in enumerate(calls):
        before = max((c[3] for c in calls[: max(k - 1, 0)]), default=-1e9)  # ends of the calls two or more before
        windows.append((op, max(issue, before), end))

    def share(lo: float, hi: float) -> float:  # each instant split among the windows over it
        cuts = sorted({lo, hi, *(t for _, a, b in windows for t in (a, b) if lo < t < hi)})
        return sum((b - a) / sum(w[1] <= a < w[2] for w in windows) for a, b in itertools.pairwise(cuts))

    served = [share(lo, hi) for op, lo, hi in windows if op == ALL_GATHER]
    per_byte = statistics.median(served) * MS / GATHER_BYTES  # one size: its median, all of it per byte
    assert rec.lanes == 2 and rec.scatter_as_all_reduce
    assert run.scatter_ns[0] == pytest.approx([2 * per_byte * SCATTER_BYTES] * len(UNITS))
    # the reduce-scatters' own ranges (issue to fsdp's wait) still make the line the table prints beside it
    assert costs[REDUCE_SCATTER].overall.calls == 2 * STEPS * len(UNITS)
    model = advise([tmp_path / "gloo.sqlite"])[0].to_json()["comm_cost"]
    assert model[REDUCE_SCATTER]["priced_as"].startswith("priced as 2 all-gathers")
    assert "priced_as" not in model[ALL_GATHER]


def test_backward_gathers_are_issued_where_the_trace_issues_them(tmp_path):
    """fsdp issues backward's first gathers from a hook on the output's gradient, after the loss's backward:
    the replay issues them that long after backward's start (per rank-step, at most the lead), as recorded."""
    from analysis.advise.sharded.recorded import recorded_shard
    from analysis.api import open_runs

    late = {("l3", 44): 46, ("l2", 44): 47}  # 2 and 3 ms into backward's 4 ms lead
    calls = [(op, u, late.get((u, i), i) if op == ALL_GATHER else i, e) for op, u, i, e in CALLS]
    write_fsdp_run(tmp_path / "late.sqlite", calls=calls)
    rec = recorded_shard(open_runs([tmp_path / "late.sqlite"]).loaded(0), "fsdp")
    first = min(i for op, _u, i, _e in calls if op == ALL_GATHER and i >= BACKWARD_AT[0]) - BACKWARD_AT[0]
    assert rec.backward_issue is not None and rec.backward_issue.tolist() == [[first * MS] * 2] * STEPS
    assert rec.spans["backward"]["lead"].tolist() == [[4 * MS] * 2] * STEPS


@pytest.mark.parametrize("impl", ["naive", "flat"])
def test_runs_advise_does_not_model_are_refused_before_their_trace_is_loaded(tmp_path, monkeypatch, capsys, impl):
    from analysis import session  # advise opens its runs through OpenRuns, which loads them

    w = NsysWriter(tmp_path / f"{impl}.sqlite", cupti=False)
    w.process(7)
    w.meta_mark(7, 7, 10, implementation=impl, rank=0, world_size=2)
    w.nvtx(7, 7, 0, 100, step_range(0), kind=PUSH_POP)
    w.close()

    def no_loading(*args, **kwargs):
        raise AssertionError("the trace was loaded")

    monkeypatch.setattr(session, "load_run", no_loading)
    with pytest.raises(TraceError, match=rf"implementation {impl}: advise predicts DDP's bucket size from a run of "):
        advise([tmp_path / f"{impl}.sqlite"])
    res = advise_cli(capsys, str(tmp_path / f"{impl}.sqlite"))
    assert res.returncode == 2 and len(res.stderr.splitlines()) == 1
    assert "overlap, overlap_bucket, torch" in res.stderr and "fsdp, torch_fsdp" in res.stderr
