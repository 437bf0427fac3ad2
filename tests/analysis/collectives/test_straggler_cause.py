"""The straggler's cause on synthetic runs against a plain-Python decomposition of each rank's run-up."""

from __future__ import annotations

import math
import random
import statistics
from pathlib import Path

import pandas as pd
import pytest

from analysis.collectives import collective_stats as stats
from analysis.collectives.collectives_view import run_call_rows
from analysis.collectives.straggler_cause import CAUSES, recurrently_late, straggler_summary, with_causes
from analysis.measure.call_groups import pair
from analysis.run.loaded_run import load_run
from analysis.trace.frames import KERNELS

MS = 1_000_000
PLACES = ("data", "forward", "backward", "optimizer", "issue", "transfer")


def synthetic_run(world: int, steps: int, slow: tuple[int, str, float] | None, seed: int = 0, buckets: bool = False):
    """(calls, spans) of a run on one clock: per step data, forward, backward, a host gap, one all-reduce
    (all ranks end together after the last arrives, plus the rank's own transfer), optimizer; `slow`:
    (rank, place, ms) added there every step; a few ms of noise everywhere. `buckets`: as overlap_bucket, two
    async all-reduces issued in backward (halfway and at its end), both ending at their completion (as gloo's
    ranges do: in the future's callback) and waited for after the host gap."""
    rng = random.Random(seed)
    now = [0.0] * world
    calls, spans = [], []
    for step in range(steps):
        arrive = []  # per rank: (after the host gap, step start, halfway through backward, backward end)
        for r in range(world):
            extra = dict.fromkeys(PLACES, 0.0)
            if slow and slow[0] == r:
                extra[slow[1]] = slow[2]
            step_start = t = now[r]
            for kind in ("data", "forward", "backward"):
                d = 20 + rng.uniform(0, 3) + extra[kind]
                spans.append((r, kind, -1, int(t * MS), int((t + d) * MS)))
                t += d
            halfway = t - d / 2
            backward_end = t
            t += 1 + rng.uniform(0, 1) + extra["issue"]
            arrive.append((t, step_start, halfway, backward_end))
        for r, (a, step_start, _, _) in enumerate(arrive):
            transfer = 5 + rng.uniform(0, 1) + extra_of(slow, r, "transfer")
            if buckets:
                end = max(x[3] for x in arrive) + transfer  # completion (gloo: the future's callback)
                for column in (2, 3):
                    issued = arrive[r][column]
                    calls.append(_call(r, step, issued, end))
            else:
                end = max(x[0] for x in arrive) + transfer
                calls.append(_call(r, step, a, end))
            d = 10 + rng.uniform(0, 3) + extra_of(slow, r, "optimizer")
            begin = max(end, a)  # after the gradient sync: its wait, or the host gap when that ended later
            spans.append((r, "optimizer", -1, int(begin * MS), int((begin + d) * MS)))
            now[r] = begin + d
            spans.append((r, "step", step, int(step_start * MS), int((begin + d) * MS)))
    rows = pair(pd.DataFrame(calls), world)
    rows["wait_ms"] = rows.pop("wait_ns") / MS
    rows["transfer_ms"] = rows.pop("transfer_ns") / MS
    spans_frame = pd.DataFrame(spans, columns=["rank", "kind", "step", "start_ns", "end_ns"])
    return rows, spans_frame


def extra_of(slow: tuple[int, str, float] | None, rank: int, place: str) -> float:
    return slow[2] if slow and slow[0] == rank and slow[1] == place else 0.0


def _call(rank: int, step: int, arrival_ms: float, end_ms: float) -> dict:
    ns = int(arrival_ms * MS)
    return {"rank": rank, "op": "all_reduce", "step": step, "issue_ns": ns, "start_ns": ns, "end_ns": int(end_ms * MS)}


def _overlap(lo: int, hi: int, pieces: list[tuple[int, int]]) -> int:
    """|[lo, hi) ∩ union(pieces)| by brute force over the merged pieces."""
    merged: list[list[int]] = []
    for s, e in sorted(pieces):
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    return sum(max(0, min(hi, e) - max(lo, s)) for s, e in merged)


def reference_causes(calls: pd.DataFrame, spans: pd.DataFrame, stragglers: pd.DataFrame, gpu: bool = False) -> dict:
    """step -> (cause, cause_ms, late_ms), from the raw rows: the straggler's collective of the step that made
    the others wait longest, anchored at the latest last arrival (no later than any rank's arrival there) of
    the collectives of that step or the one before that it saw complete before it. `gpu`: the phases and the
    host gap are measured on each rank's host window instead, from its issue of its last collective of the step
    before (its step's start without one) to its issue of the decisive one, the host gap outside its sync waits."""
    out = {}
    rows = calls.to_dict("records")
    span_rows = spans.to_dict("records")
    for s in stragglers.dropna(subset=["straggler"]).to_dict("records"):
        step, late = s["step"], int(s["straggler"])
        decisive = max(
            (r for r in rows if r["step"] == step and r["rank"] == late and r["last_rank"] == late),
            key=lambda r: sum(
                x["wait_ms"] for x in rows if (x["op"], x["step"], x["seq"]) == (r["op"], step, r["seq"])
            ),
        )
        key = (decisive["op"], step, decisive["seq"])
        mine = {r["rank"]: r for r in rows if (r["op"], r["step"], r["seq"]) == key}
        earliest = min(r["start_ns"] for r in mine.values())
        ended = [
            r
            for r in rows
            if r["rank"] == late
            and r["step"] in (step - 1, step)
            and r["end_ns"] < decisive["start_ns"]
            and r["last_arrival_ns"] <= earliest
        ]
        if ended:
            anchor = max(r["last_arrival_ns"] for r in ended)
        else:
            anchor = min(x["start_ns"] for x in span_rows if x["kind"] == "step" and x["step"] == step)
        parts = {}
        for rank, call in mine.items():
            lo, hi = anchor, max(anchor, call["start_ns"])
            own = [x for x in span_rows if x["rank"] == rank]
            phases = [
                (x["start_ns"], x["end_ns"]) for x in own if x["kind"] in ("data", "forward", "backward", "optimizer")
            ]
            figures = {
                k: _overlap(lo, hi, [(x["start_ns"], x["end_ns"]) for x in own if x["kind"] == k])
                for k in ("data", "forward", "backward", "optimizer")
            }
            comm = [(r["start_ns"], r["end_ns"]) for r in rows if r["rank"] == rank]
            covered = _overlap(lo, hi, phases + comm)
            figures["transfer"] = covered - _overlap(lo, hi, phases)
            figures["issue"] = (hi - lo) - covered
            figures["window"] = hi - lo
            if gpu:  # phases and the host gap on the host's clock, from its own issue times
                before = [r["issue_ns"] for r in rows if r["rank"] == rank and r["step"] == step - 1]
                h_hi = call["issue_ns"]
                h_lo = (
                    max(before)
                    if before
                    else next(x["start_ns"] for x in own if x["kind"] == "step" and x["step"] == step)
                )
                h_lo = min(h_lo, h_hi)
                for k in ("data", "forward", "backward", "optimizer"):
                    figures[k] = _overlap(h_lo, h_hi, [(x["start_ns"], x["end_ns"]) for x in own if x["kind"] == k])
                waits = [(x["start_ns"], x["end_ns"]) for x in own if x["kind"] == "sync_wait"]
                figures["issue"] = (h_hi - h_lo) - _overlap(h_lo, h_hi, phases + waits)
            parts[rank] = figures
        excess = {
            k: parts[late][k] - statistics.median(p[k] for r, p in parts.items() if r != late)
            for k in (*CAUSES, "window")
        }
        best = max(CAUSES, key=lambda k: (excess[k], -CAUSES.index(k)))
        out[step] = (best if excess[best] > 0 else None, excess[best] / MS, excess["window"] / MS)
    return out


def gpu_run(world: int, steps: int, slow: tuple[int, str, float] | None, seed: int = 0, gpu_ms: tuple = (6, 28)):
    """(calls, spans) of a GPU-like run as overlap_bucket records it under NCCL: the host launches fast (its phase
    ranges are short) and runs ahead of the GPU; each call's issue is on the host, its arrival and end are its
    kernel's (start: when both the host launched it and the GPU reached it). Two buckets per step, issued halfway
    through and at the end of the host's backward, still in flight when the host leaves backward; the host then
    waits for the last one (grad sync) and runs the optimizer. `slow` sleeps on the host: at the start of data,
    forward, backward or optimizer, or after backward (issue: the buckets are in flight, the GPU still has
    backward queued, so the stall shows only in the next step). `gpu_ms`: the GPU's forward and backward (the
    host launches each in about 4 ms): the longer, the further the host runs ahead."""
    rng = random.Random(seed)
    host, free = [0.0] * world, [0.0] * world  # per rank: the host's clock, the GPU's end of work
    calls, spans = [], []
    for step in range(steps):
        issued = []  # per rank: (host issue, GPU ready) of the two buckets
        marks = []
        for r in range(world):
            extra = {p: extra_of(slow, r, p) for p in PLACES}
            start = t = host[r]
            gpu = free[r]
            for kind, host_ms, busy in (("data", 3, 0), ("forward", 4, gpu_ms[0]), ("backward", 4, gpu_ms[1])):
                d = host_ms + rng.uniform(0, 0.5) + extra[kind]
                spans.append((r, kind, -1, int(t * MS), int((t + d) * MS)))
                launched = t + extra[kind]  # the kernels are launched after the sleep
                if kind == "backward":
                    half = max(gpu, launched) + busy / 2  # the GPU reaches the first bucket's gradients
                    issued.append(((launched + (t + d - launched) / 2, half), (t + d, 0.0)))
                gpu = max(gpu, launched) + busy * (1 + rng.uniform(0, 0.05)) if busy else gpu
                t += d
            issued[-1] = (issued[-1][0], (issued[-1][1][0], gpu))
            marks.append((start, t + 0.5 + rng.uniform(0, 0.3) + extra["issue"]))
            free[r] = gpu
        ends = []
        for b in (0, 1):
            arrive = [max(issued[r][b][0], issued[r][b][1]) for r in range(world)]
            end = max(arrive) + 2 + rng.uniform(0, 0.5)
            for r in range(world):
                calls.append({**_call(r, step, arrive[r], end), "issue_ns": int(issued[r][b][0] * MS)})
            ends.append(end)
        for r in range(world):
            start, after = marks[r]
            begin = max(after, ends[1])  # the grad sync waits for the last bucket on the host
            spans.append((r, "sync_wait", -1, int(after * MS), int(begin * MS)))
            d = 2 + rng.uniform(0, 0.3) + extra_of(slow, r, "optimizer")
            spans.append((r, "optimizer", -1, int(begin * MS), int((begin + d) * MS)))
            free[r] = max(free[r], ends[1], begin + extra_of(slow, r, "optimizer")) + 6  # optimizer kernels
            host[r] = begin + d
            spans.append((r, "step", step, int(start * MS), int(host[r] * MS)))
    rows = pair(pd.DataFrame(calls), world)
    rows["wait_ms"] = rows.pop("wait_ns") / MS
    rows["transfer_ms"] = rows.pop("transfer_ns") / MS
    rows["source"] = KERNELS
    return rows, pd.DataFrame(spans, columns=["rank", "kind", "step", "start_ns", "end_ns"])


@pytest.mark.parametrize("place", ["data", "forward", "backward", "optimizer", "issue"])
def test_gpu_trace_host_stall_is_told_from_a_longer_phase(place):
    """On a GPU trace the host runs ahead: a stall after backward, with the buckets in flight, holds the others
    in the next step and is named `issue`, a sleep inside a phase that phase, each as plain Python measures it
    on the host windows; the stall's size is the cause's."""
    calls, spans = gpu_run(4, 6, (1, place, 40.0), seed=5)
    strag = with_causes(stats.stragglers(calls), calls, spans)
    want = reference_causes(calls, spans, stats.stragglers(calls), gpu=True)
    for row in strag.to_dict("records"):
        cause, cause_ms, late_ms = want[row["step"]]
        assert row["cause"] == cause
        assert row["cause_ms"] == pytest.approx(cause_ms, abs=1e-6)
        assert row["late_ms"] == pytest.approx(late_ms, abs=1e-6)
    held = strag[strag["step"] > 0] if place in ("issue", "optimizer") else strag
    assert (held["straggler"] == 1).all() and (held["cause"] == place).all()
    assert held["cause_ms"].between(30, 45).all()


def test_gpu_trace_longer_backward_far_behind_the_host_is_not_read_as_a_host_stall():
    """With the GPU far behind the host, a sleep at the start of backward shows on the arrival windows (a CPU
    trace's rule) as time in no range in some steps; on the host windows it is the backward's every step."""
    calls, spans = gpu_run(4, 6, (1, "backward", 40.0), seed=5, gpu_ms=(30, 40))
    strag = with_causes(stats.stragglers(calls), calls, spans)
    want = reference_causes(calls, spans, stats.stragglers(calls), gpu=True)
    assert [want[s][0] for s in strag["step"]] == list(strag["cause"]) == ["backward"] * 6
    arrival_rule = with_causes(stats.stragglers(calls), calls.drop(columns="source"), spans)
    assert (arrival_rule["cause"] == "issue").any()


@pytest.mark.parametrize("place", PLACES)
@pytest.mark.parametrize("world", [4, 8])
def test_cause_names_the_slow_place_and_matches_plain_python(place, world):
    calls, spans = synthetic_run(world, 8, (world - 2, place, 40.0), seed=world)
    strag = with_causes(stats.stragglers(calls), calls, spans)
    want = reference_causes(calls, spans, stats.stragglers(calls))
    for row in strag.to_dict("records"):
        cause, cause_ms, late_ms = want[row["step"]]
        assert row["cause"] == cause
        assert row["cause_ms"] == pytest.approx(cause_ms, abs=1e-6)
        assert row["late_ms"] == pytest.approx(late_ms, abs=1e-6)
    # a longer optimizer or transfer of step k makes the rank late in step k+1: step 0 has nothing to show
    held = strag if place not in ("optimizer", "transfer") else strag[strag["step"] > 0]
    assert (held["straggler"] == world - 2).all()
    assert (held["cause"] == place).all()
    summary = straggler_summary(strag, world).set_index("rank")
    assert summary.loc[world - 2, "recurrently_late"]
    assert summary.loc[world - 2, "causes"][place] == len(held)
    assert summary["steps_held"].sum() == strag["straggler"].notna().sum()
    assert summary.loc[world - 2, "wait_caused_ms"] == pytest.approx(
        strag.loc[strag["straggler"] == world - 2, "wait_caused_ms"].sum()
    )


@pytest.mark.parametrize("place", ["backward", "issue"])
def test_async_buckets_in_flight_are_no_anchor(place):
    """Two buckets issued in backward, still in flight when the next is issued: a stall after backward holds
    the others in the next step's buckets, and the cause is still the stall, measured from the latest last
    arrival of the buckets the rank saw complete."""
    calls, spans = synthetic_run(4, 6, (1, place, 40.0), seed=3, buckets=True)
    strag = with_causes(stats.stragglers(calls), calls, spans)
    want = reference_causes(calls, spans, stats.stragglers(calls))
    for row in strag.to_dict("records"):
        assert row["cause"] == want[row["step"]][0]
        assert row["cause_ms"] == pytest.approx(want[row["step"]][1], abs=1e-6)
    held = strag if place == "backward" else strag[strag["step"] > 0]
    assert (held["straggler"] == 1).all() and (held["cause"] == place).all()
    assert (held["cause_ms"] > 30).all()


def test_no_slow_rank_is_not_recurrently_late():
    for seed in range(20):
        calls, spans = synthetic_run(4, 10, None, seed=seed)
        strag = with_causes(stats.stragglers(calls), calls, spans)
        assert not straggler_summary(strag, 4)["recurrently_late"].any(), seed


def test_recurrently_late_is_the_stated_binomial_rule():
    def tail(held, steps, p):
        return sum(math.comb(steps, k) * p**k * (1 - p) ** (steps - k) for k in range(held, steps + 1))

    for world in (2, 4, 8):
        for steps in range(1, 13):
            for held in range(steps + 1):
                want = 2 * held >= steps and tail(held, steps, 1 / world) < 0.01 / world
                assert recurrently_late(held, steps, world) == want
    assert recurrently_late(10, 10, 4) and not recurrently_late(5, 10, 4)


FOREIGN = Path(__file__).resolve().parents[3] / ".." / "shared" / "data" / "nsys2026_2xH100_torchrun.sqlite"


@pytest.mark.skipif(not FOREIGN.exists(), reason="../shared/data/nsys2026_2xH100_torchrun.sqlite not present")
def test_a_job_without_step_ranges_keeps_the_arrival_windows_cause():
    """A torchrun job of someone else's (no step ranges: its calls are one step, -1) has no window on the host:
    no call before the decisive one's step and no step start. Its cause is then what the arrival windows give (a
    CPU trace's rule), not none."""
    run = load_run([FOREIGN])
    calls, _, _, spans = run_call_rows(run)
    strag = with_causes(stats.stragglers(calls), calls, spans)
    arrival_rule = with_causes(stats.stragglers(calls), calls.drop(columns="source"), spans)
    assert list(strag["step"]) == [-1] and strag["cause"].notna().all()
    columns = ["straggler", "cause", "cause_ms", "late_ms"]
    assert strag[columns].to_dict("records") == arrival_rule[columns].to_dict("records")


def test_two_groups_kth_all_reduce_are_two_collectives():
    """Two process groups ({0,1} and {2,3}) each all-reducing in every step: the slow rank's run-up is measured
    against its own group's members only, as in a run of that group alone."""
    fast, _ = synthetic_run(2, 6, None, seed=1)
    slow, spans = synthetic_run(2, 6, (1, "backward", 40.0), seed=2)
    _, fast_spans = synthetic_run(2, 6, None, seed=1)
    both = pd.concat(
        [fast.assign(group_ranks="0,1"), slow.assign(rank=slow["rank"] + 2, last_rank=slow["last_rank"] + 2)],
        ignore_index=True,
    )
    both.loc[both["rank"] >= 2, "group_ranks"] = "2,3"
    all_spans = pd.concat([fast_spans, spans.assign(rank=spans["rank"] + 2)], ignore_index=True)
    strag = with_causes(stats.stragglers(both), both, all_spans)
    alone = with_causes(stats.stragglers(slow), slow, spans)
    assert (strag["straggler"] == 3).all() and (alone["straggler"] == 1).all()
    columns = ["step", "cause", "cause_ms", "late_ms"]
    assert strag[columns].to_dict("records") == alone[columns].to_dict("records")
    assert (strag["cause"] == "backward").all()
