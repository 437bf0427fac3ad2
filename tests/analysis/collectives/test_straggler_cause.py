"""The straggler's cause on synthetic runs against a plain-Python decomposition of each rank's run-up."""

from __future__ import annotations

import math
import random
import statistics

import pandas as pd
import pytest

from analysis.collectives import collective_stats as stats
from analysis.collectives.straggler_cause import CAUSES, recurrently_late, straggler_summary, with_causes
from analysis.measure.call_groups import pair

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


def reference_causes(calls: pd.DataFrame, spans: pd.DataFrame, stragglers: pd.DataFrame) -> dict:
    """step -> (cause, cause_ms, late_ms), from the raw rows: the straggler's collective of the step that made
    the others wait longest, anchored at the latest last arrival (no later than any rank's arrival there) of
    the collectives of that step or the one before that it saw complete before it."""
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
            phases = [(x["start_ns"], x["end_ns"]) for x in own if x["kind"] != "step"]
            figures = {
                k: _overlap(lo, hi, [(x["start_ns"], x["end_ns"]) for x in own if x["kind"] == k])
                for k in ("data", "forward", "backward", "optimizer")
            }
            comm = [(r["start_ns"], r["end_ns"]) for r in rows if r["rank"] == rank]
            covered = _overlap(lo, hi, phases + comm)
            figures["transfer"] = covered - _overlap(lo, hi, phases)
            figures["issue"] = (hi - lo) - covered
            figures["window"] = hi - lo
            parts[rank] = figures
        excess = {
            k: parts[late][k] - statistics.median(p[k] for r, p in parts.items() if r != late)
            for k in (*CAUSES, "window")
        }
        best = max(CAUSES, key=lambda k: (excess[k], -CAUSES.index(k)))
        out[step] = (best if excess[best] > 0 else None, excess[best] / MS, excess["window"] / MS)
    return out


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
