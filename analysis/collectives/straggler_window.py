"""The straggler's decisive collective of each step and every rank's run-up window to it, over numpy arrays.

The rules are straggler_cause's (its module docstring): this module finds, per step with a straggler, the
decisive collective and its anchor (`decisive`), and measures each rank's window from the anchor to its arrival
there (`window_parts`) or, on GPU traces, its host window (`host_parts`), split into CAUSES. The call rows are
read once into `CallArrays` (each collective numbered in its key's sort order) and the ranges into
`RangeArrays`; groups are found by sorting and searching, not by frame merges.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from analysis.measure import intervals as iv
from analysis.measure.rank_spans import SYNC_WAIT

PHASE_PARTS = ("data", "forward", "backward", "optimizer")
CAUSES = (*PHASE_PARTS, "transfer", "issue")
_NONE = np.iinfo(np.int64).min  # no value (an int64 column's missing)


@dataclass(frozen=True)
class CallArrays:
    """The paired call rows as arrays; `call` numbers each row's collective (call_key) in the key's sort order."""

    call: np.ndarray
    rank: np.ndarray
    step: np.ndarray
    last_rank: np.ndarray
    wait_ms: np.ndarray
    start: np.ndarray
    end: np.ndarray
    issue: np.ndarray
    last_arrival: np.ndarray


@dataclass(frozen=True)
class RangeArrays:
    """A trace's rank_spans (or call rows) as arrays: rank, kind, step, start and end (ns)."""

    rank: np.ndarray
    kind: np.ndarray
    step: np.ndarray
    start: np.ndarray
    end: np.ndarray

    @staticmethod
    def of(frame: pd.DataFrame) -> RangeArrays:
        kind = frame["kind"].to_numpy(object) if "kind" in frame else np.full(len(frame), "", dtype=object)
        step = frame["step"].to_numpy(np.int64) if "step" in frame else np.zeros(len(frame), np.int64)
        return RangeArrays(
            frame["rank"].to_numpy(np.int64), kind, step, *(frame[c].to_numpy(np.int64) for c in ("start_ns", "end_ns"))
        )

    def where(self, keep: np.ndarray) -> RangeArrays:
        return RangeArrays(self.rank[keep], self.kind[keep], self.step[keep], self.start[keep], self.end[keep])


def call_key(paired: pd.DataFrame) -> list[str]:
    """The columns naming one collective: op, step, seq, and its group's members where calls carry groups (two
    groups' k-th all-reduces of a step are two collectives)."""
    return ["op", "step", "seq", *(["group_ranks"] if "group_ranks" in paired else [])]


def call_arrays(paired: pd.DataFrame) -> CallArrays:
    """`paired` as CallArrays."""
    columns = [
        pd.factorize(paired[c], sort=True)[0] if paired[c].dtype.kind not in "iu" else paired[c].to_numpy(np.int64)
        for c in call_key(paired)
    ]
    call = np.unique(np.column_stack(columns), axis=0, return_inverse=True)[1].ravel()
    column = {c: paired[c].to_numpy(np.int64) for c in ("rank", "step", "last_rank")}
    ns = {c: paired[f"{c}_ns"].to_numpy(np.int64) for c in ("issue", "start", "end", "last_arrival")}
    wait_ms = _missing_as_zero(paired["wait_ms"].to_numpy(np.float64))  # a sum skips missing waits
    return CallArrays(call=call, **column, wait_ms=wait_ms, **ns)


@dataclass(frozen=True)
class Decisive:
    """Per step with a straggler, in step order: its decisive collective (`call`), the straggler and the anchor."""

    call: np.ndarray
    step: np.ndarray
    straggler: np.ndarray
    anchor: np.ndarray


def decisive(calls: CallArrays, steps: np.ndarray, stragglers: np.ndarray, spans: RangeArrays) -> Decisive:
    """Per step of `steps` (its straggler in `stragglers`): the straggler's collective of the step that made the
    others wait longest (the first in key order on a tie), and its anchor (_anchors, else the earliest step start
    among the ranks); steps with neither, or whose straggler has no row in that collective, are left out."""
    order = np.argsort(steps, kind="stable")
    steps, stragglers = steps[order], stragglers[order]
    chosen_call, chosen_step = _most_waited(calls, steps, stragglers)
    straggler = stragglers[np.searchsorted(steps, chosen_step)]
    own = _row_of(calls, chosen_call, straggler)
    found = own >= 0
    chosen_call, chosen_step, straggler, own = chosen_call[found], chosen_step[found], straggler[found], own[found]
    earliest = np.full(int(calls.call.max()) + 1, np.iinfo(np.int64).max)
    np.minimum.at(earliest, calls.call, calls.start)
    anchor = _anchors(calls, chosen_step, straggler, calls.start[own], earliest[chosen_call])
    anchor = np.where(anchor == _NONE, _step_starts(spans, chosen_step), anchor)
    keep = anchor != _NONE
    return Decisive(chosen_call[keep], chosen_step[keep], straggler[keep], anchor[keep])


def _most_waited(calls: CallArrays, steps: np.ndarray, stragglers: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(collective, step) per step of `steps` (sorted) that has one: among the collectives whose last rank was
    the step's straggler, the one whose rows waited longest in all (the first in key order on a tie)."""
    width = int(max(calls.last_rank.max(), stragglers.max())) + 1
    pair = calls.call * width + calls.last_rank
    group, first = np.unique(pair, return_index=True)  # (collective, last rank), in key order
    caused = np.bincount(np.searchsorted(group, pair), weights=calls.wait_ms)
    step = calls.step[first]
    at = np.searchsorted(steps, step).clip(0, len(steps) - 1)
    held = (steps[at] == step) & (stragglers[at] == group % width)  # its last rank held its step
    best = np.lexsort((np.arange(len(group)), -caused, step))
    best = best[held[best]]
    best = best[np.unique(step[best], return_index=True)[1]]  # the first of each step: the most wait caused
    return group[best] // width, step[best]


def _row_of(calls: CallArrays, call: np.ndarray, rank: np.ndarray) -> np.ndarray:
    """The row of each (collective, rank), -1 where it has none."""
    width = int(max(calls.rank.max(), rank.max(initial=0))) + 1
    keys = calls.call * width + calls.rank
    order = np.argsort(keys, kind="stable")
    wanted = call * width + rank
    at = np.searchsorted(keys[order], wanted).clip(0, len(keys) - 1)
    return np.where(keys[order][at] == wanted, order[at], -1)


def _anchors(
    calls: CallArrays, step: np.ndarray, straggler: np.ndarray, own_start: np.ndarray, earliest: np.ndarray
) -> np.ndarray:
    """Per decisive collective: the latest last arrival, at or before every rank's arrival at it, among the
    collectives of its step or the one before that the straggler saw complete before its own arrival: the
    latest instant all ranks were in step (_NONE without one). An async call still in flight, or one the others
    had already left behind (they issued the decisive call before it completed), is no such instant."""
    owner, row = _rows_of_rank_steps(calls, np.r_[straggler, straggler], np.r_[step, step - 1])
    owner = owner % len(step)
    ok = (calls.end[row] < own_start[owner]) & (calls.last_arrival[row] <= earliest[owner])
    out = np.full(len(step), _NONE)
    np.maximum.at(out, owner[ok], calls.last_arrival[row[ok]])
    return out


def _rows_of_rank_steps(calls: CallArrays, rank: np.ndarray, step: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every call row of each (rank, step) asked: (index of the ask, row) pairs."""
    base = min(calls.step.min(), step.min(initial=0))
    width = int(max(calls.step.max(), step.max(initial=0)) - base) + 1
    keys = calls.rank * width + (calls.step - base)
    order = np.argsort(keys, kind="stable")
    wanted = rank * width + (step - base)
    lo, hi = np.searchsorted(keys[order], wanted, "left"), np.searchsorted(keys[order], wanted, "right")
    counts = hi - lo
    owner = np.repeat(np.arange(len(rank)), counts)
    offset = np.arange(len(owner)) - np.repeat(np.cumsum(counts) - counts, counts)
    return owner, order[np.repeat(lo, counts) + offset]


def _step_starts(spans: RangeArrays, step: np.ndarray) -> np.ndarray:
    """Per step: the earliest start of its step ranges among the ranks (_NONE without one)."""
    steps = spans.where(spans.kind == "step")
    if steps.step.size == 0:
        return np.full(len(step), _NONE)
    order = np.argsort(steps.step, kind="stable")
    known, first = np.unique(steps.step[order], return_index=True)
    earliest = np.minimum.reduceat(steps.start[order], first)
    at = np.searchsorted(known, step).clip(0, len(known) - 1)
    return np.where(known[at] == step, earliest[at], _NONE)


def window_parts(chosen: Decisive, calls: CallArrays, comm: RangeArrays, spans: RangeArrays) -> dict[str, np.ndarray]:
    """One row per (decisive collective, rank): step, rank, straggler, window_ns and the ns of each of CAUSES,
    each rank's window from the anchor to its arrival at the decisive collective; `comm`: every call row."""
    owner, row = _rows_of_calls(calls, chosen.call)
    lo = chosen.anchor[owner]
    hi = np.maximum(calls.start[row], lo)
    parts = split_window(calls.rank[row], lo, hi, spans, comm)
    return {"step": chosen.step[owner], "rank": calls.rank[row], "straggler": chosen.straggler[owner]} | {
        "window_ns": hi - lo,
        **parts,
    }


def host_parts(chosen: Decisive, calls: CallArrays, spans: RangeArrays) -> dict[str, np.ndarray]:
    """window_parts' rows on the host's clock (GPU traces, where the host runs ahead of its GPU): each rank's
    window from its issue of its last collective of the step before (its step's start without one) to its issue
    of the decisive collective; the ns of each phase, `transfer` (in its `sync_wait` ranges outside the phases:
    the host waiting for the collectives) and `issue` (in none of those ranges)."""
    owner, row = _rows_of_calls(calls, chosen.call)
    rank, step, hi = calls.rank[row], chosen.step[owner], calls.issue[row]
    asked, before_row = _rows_of_rank_steps(calls, rank, step - 1)
    before = np.full(len(row), _NONE)
    np.maximum.at(before, asked, calls.issue[before_row])
    lo = np.where(before != _NONE, before, _own_step_starts(spans, rank, step))
    lo = np.where(lo == _NONE, hi, np.minimum(lo, hi))
    waits = spans.where(spans.kind == SYNC_WAIT)  # the host waiting for the collectives: neither phase nor stall
    return {"window_ns": hi - lo, **split_window(rank, lo, hi, spans, waits)}


def _rows_of_calls(calls: CallArrays, call: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every row of each collective asked, in the rows' order: (index of the ask, row) pairs."""
    order = np.argsort(calls.call, kind="stable")
    lo = np.searchsorted(calls.call[order], call, "left")
    counts = np.searchsorted(calls.call[order], call, "right") - lo
    owner = np.repeat(np.arange(len(call)), counts)
    offset = np.arange(len(owner)) - np.repeat(np.cumsum(counts) - counts, counts)
    return owner, order[np.repeat(lo, counts) + offset]


def _own_step_starts(spans: RangeArrays, rank: np.ndarray, step: np.ndarray) -> np.ndarray:
    """The start of each (rank, step)'s first step range (_NONE without one)."""
    steps = spans.where(spans.kind == "step")
    if steps.step.size == 0:
        return np.full(len(rank), _NONE)
    base = min(steps.step.min(), step.min(initial=0))
    width = int(max(steps.step.max(), step.max(initial=0)) - base) + 1
    known, first = np.unique(steps.rank * width + (steps.step - base), return_index=True)
    wanted = rank * width + (step - base)
    at = np.searchsorted(known, wanted).clip(0, len(known) - 1)
    return np.where(known[at] == wanted, steps.start[first[at]], _NONE)


def split_window(
    rank_of: np.ndarray, lo: np.ndarray, hi: np.ndarray, spans: RangeArrays, comm: RangeArrays
) -> dict[str, np.ndarray]:
    """Per window [lo, hi) of a rank: ns inside each phase's ranges, inside the rank's `comm` ranges outside those
    (`transfer`) and inside none of them (`issue`)."""
    out = {part: np.zeros(len(lo), dtype=np.int64) for part in CAUSES}
    is_phase = np.isin(spans.kind, PHASE_PARTS)
    for rank in np.unique(rank_of):  # one iteration per rank: its ranges' unions, every window at once
        mine = np.flatnonzero(rank_of == rank)
        own = spans.where((spans.rank == rank) & is_phase)
        phase_sets = {k: iv.union(own.start[own.kind == k], own.end[own.kind == k]) for k in PHASE_PARTS}
        phases = iv.union(own.start, own.end)
        calls = comm.rank == rank
        transfer = iv.subtract(*iv.union(comm.start[calls], comm.end[calls]), *phases)
        for part, (s, e) in (*phase_sets.items(), ("transfer", transfer)):
            out[part][mine] = iv.overlap_lengths(lo[mine], hi[mine], s, e)
        everything = iv.union(np.r_[phases[0], transfer[0]], np.r_[phases[1], transfer[1]])
        out["issue"][mine] = (hi[mine] - lo[mine]) - iv.overlap_lengths(lo[mine], hi[mine], *everything)
    return out


def _missing_as_zero(values: np.ndarray) -> np.ndarray:
    return np.where(np.isnan(values), 0.0, values)
