"""The sharded replay (advise/sharded/replay.py) on runs small enough to work out by hand.

Every run: 2 identical ranks, 4 units, one row; times in ms. Each schedule is written out in the test's
docstring as worked by hand from fsdp's rules (docs/advise.md, "Sharded runs")."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from analysis.advise.sharded.replay import Phase, Setting, ShardRun, replay

U, R = 4, 2


def phase(lead: float, own: float, glue: float = 0.0) -> Phase:
    return Phase(np.full((1, R), lead), np.full((1, R, U), own), np.full((1, R, U), glue))


def run(gather: float, scatter: float, lead: float, own: float, *, lanes: int = 1, slowdown: float = 0.0,
        offset: tuple[float, float] | None = None) -> ShardRun:  # fmt: skip
    return ShardRun(
        forward=phase(lead, own),
        backward=phase(lead, own),
        gap=np.zeros((1, R)),
        other=np.zeros((1, R)),
        gather_ns=np.full((1, U), gather),
        scatter_ns=np.full((1, U), scatter),
        reduce_ns=np.zeros((1, U)),
        slowdown=np.array([slowdown]),
        offset=None if offset is None else np.array([offset], dtype=float),
        lanes=lanes,
    )


def test_depth_two_hides_every_gather_and_depth_one_does_not():
    """Gathers of 6 ms, units of 10 ms, 6 ms of compute before the first unit, nothing to reduce.
    Depth 1: unit k's gather is issued when unit k-1 ends and the unit waits all 6 ms of it (units 1-3):
    18 ms per phase, each phase 6 + 40 + 18 = 64 ms, the step 128. Depth 2: the first two are issued at
    the phase's start (ending at 6 and 12), unit k+2's when unit k ends, 10 ms before it is needed: no
    wait, each phase 6 + 40 = 46, the step 92."""
    r = run(gather=6, scatter=0, lead=6, own=10)
    one, two = replay(r, Setting(1, False)), replay(r, Setting(2, False))
    assert one.forward_wait[0, 0].tolist() == [0, 6, 6, 6] and one.backward_wait[0, 0].tolist() == [6, 6, 6, 0]
    assert one.step.tolist() == [[128, 128]]
    assert two.forward_wait.sum() == 0 and two.backward_wait.sum() == 0
    assert two.step.tolist() == [[92, 92]] and two.tail.tolist() == [[0, 0]]


def test_separating_reduce_scatters_removes_the_backward_queueing():
    """Gathers 4 ms, reduce-scatters 8 ms, units 10 ms, lead 4, depth 2. Forward: no wait, 44 ms.
    Backward (from 44; times after it), shared: gathers 1, 2 end at 4, 8; unit 1 runs 4-14, issues
    RS1 (14-22) then G3, queued behind RS1 (22-26); unit 2 runs 14-24, RS2 waits for G3 (26-34), G4
    behind it (34-38); unit 3 needs G3 at 24: waits 2, runs 26-36; RS3 38-46; unit 4 needs G4 at 36:
    waits 2, runs 38-48; RS4 48-56: tail 8. Step 44 + 48 + 8 = 100, backward waits 4. Separate: G3 runs
    at 14-18 and G4 at 24-28 beside the reduce-scatters, no wait; units end at 44, RS4 44-52, tail 8:
    step 96."""
    r = run(gather=4, scatter=8, lead=4, own=10)
    shared, separate = replay(r, Setting(2, False)), replay(r, Setting(2, True))
    assert shared.forward_wait.sum() == 0 and separate.forward_wait.sum() == 0
    # backward_wait is in forward unit order: units 2 and 1 are the third and fourth of backward
    assert shared.backward_wait[0, 0].tolist() == [2, 2, 0, 0]
    assert shared.step.tolist() == [[100, 100]] and shared.tail.tolist() == [[8, 8]]
    assert separate.backward_wait.sum() == 0
    assert separate.step.tolist() == [[96, 96]] and separate.tail.tolist() == [[8, 8]]


def test_two_collectives_at_once_on_one_group_queue_like_separate_groups():
    """gloo runs two collectives at once per process group: the gather no longer queues behind the
    reduce-scatter, so the shared group replays as the separate one above (step 96)."""
    r = run(gather=4, scatter=8, lead=4, own=10, lanes=2)
    assert replay(r, Setting(2, False)).step.tolist() == [[96, 96]]
    assert replay(r, Setting(2, True)).step.tolist() == [[96, 96]]


def test_separating_cannot_help_a_compute_bound_run():
    """Reduce-scatters of 2 ms: the gather queued behind one (G3 at 16-20) is still there 4 ms before
    unit 3 needs it (24): no wait either way; forward 44, backward 44, the last reduce-scatter's 2 ms
    after it: the step is 90 both ways."""
    r = run(gather=4, scatter=2, lead=4, own=10)
    shared, separate = replay(r, Setting(2, False)), replay(r, Setting(2, True))
    assert shared.backward_wait.sum() == 0 and separate.backward_wait.sum() == 0
    assert shared.step.tolist() == separate.step.tolist() == [[90, 90]]


def test_the_late_rank_holds_the_collective_for_both():
    """Rank 1 starts 5 ms late: the first gather (issued at each rank's start) runs once both issued
    it, 5-11: rank 0, needing it at 6, waits 5; rank 1 needs it at 11: no wait."""
    r = run(gather=6, scatter=0, lead=6, own=10, offset=(0.0, 5.0))
    out = replay(r, Setting(2, False))
    assert out.forward_wait[0, :, 0].tolist() == [5, 0]


def test_compute_slows_by_the_communication_beside_it():
    """slowdown 0.5, depth 2, gathers 6, lead 0: unit 1's gather (issued at 0, queued behind unit 0's)
    runs 6-12 while unit 0 computes from 6: 10 ms of work with 6 ms of communication beside it take
    10 + 0.5 x 6 = 13 ms."""
    r = run(gather=6, scatter=0, lead=0, own=10, slowdown=0.5)
    out = replay(r, Setting(2, False))
    assert out.forward_wait[0, 0, 0] == 6 and out.forward_wait[0, 0, 1] == 0
    assert replay(run(gather=6, scatter=0, lead=0, own=10), Setting(2, False)).forward[0, 0] < out.forward[0, 0]

    assert Setting(1, True).prefetch == 1
    with pytest.raises(ValueError, match="prefetch must be an integer >= 1, got 0"):
        Setting(0, False)


def test_a_unit_backward_does_not_gather_is_left_out_of_backward():
    """FSDP2's root is gathered in forward only: backward replays units 2, 1, 0 (gathers 6 ms, units 10 ms,
    lead 6, depth 2): gathers 2 and 1 at its start (0-6, 6-12), gather 0 when unit 2 ends (16-22), no
    wait: 6 + 30 = 36 ms after forward's 46 (the first case's depth 2): the step is 82."""
    from dataclasses import replace

    r = run(gather=6, scatter=0, lead=6, own=10)
    three = Phase(np.full((1, R), 6.0), np.full((1, R, 3), 10.0), np.zeros((1, R, 3)))
    out = replay(replace(r, backward=three, backward_units=np.array([2, 1, 0])), Setting(2, False))
    assert out.step.tolist() == [[82, 82]] and out.backward.tolist() == [[36, 36]]
    assert out.backward_wait.sum() == 0 and out.backward_wait.shape == (1, R, U)


def test_backward_gathers_issued_after_the_lead_are_waited_for():
    """As the first case at depth 2 (46 ms per phase, no wait), but backward's first two gathers issued 6 ms
    after its start, once its lead has run (fsdp's hook on the output's gradient): they end 6 and 12 ms
    later; the first backward unit needs its weights at the same point and waits 6 ms; the next ones are
    issued 10 ms before they are needed, as before. Backward 6 + 6 + 40 = 52 ms, the step 98."""
    late = replace(run(gather=6, scatter=0, lead=6, own=10), backward_issue=np.full((1, R), 6.0))
    r = replay(late, Setting(2, False))
    assert r.forward_wait.sum() == 0 and r.backward_wait[0, 0].tolist() == [0, 0, 0, 6]
    assert r.backward.tolist() == [[52, 52]] and r.step.tolist() == [[98, 98]]


def test_a_setting_is_a_depth_of_at_least_one():
    assert Setting(1, True).prefetch == 1
    with pytest.raises(ValueError, match="prefetch must be an integer >= 1, got 0"):
        Setting(0, False)
