"""Why the straggler of a step was late, and which ranks are late step after step.

For each step's straggler (collective_stats.stragglers) the decisive collective is the one of the step in
which it arrived last and made the others wait longest. Every rank's run-up to it is the window from the
anchor to its own arrival there: the anchor is the latest last arrival, no later than any rank's arrival at
that call, among the paired collectives of the step or the one before that the straggler saw complete before
it (one instant for every rank: all of them had arrived, none had gone on to the decisive call; an async call
still in flight does not count), else the earliest start of the step among the ranks. Each rank's window is
split into time inside its `data`, `forward`, `backward` and `optimizer` ranges, inside its collective calls
outside those (`transfer`: the tail of the previous collective, which a slower transfer ends later) and inside
none of them (`issue`: the host stalled or launched late while its compute was done). The straggler's excess
over the median of the other ranks in each part says where its lateness came from: `cause` is the part with
the largest excess (`cause_ms`), `late_ms` the whole lateness (its window less the others' median); None when
no part exceeds the others'. A call's range is taken as the trace has it: on CPU an async call ends at its
completion.

On GPU traces (calls from kernels) the host runs ahead of its GPU: by the anchor, a host that stalled after
backward with the buckets in flight has often stalled already, and a GPU far behind its host reads a sleep at
the start of backward as time in no range. There the phases and the host gap are measured on the host's clock
instead (straggler_window.host_parts): each rank's window runs from its issue of its last collective of the
step before (its step's start without one) to its issue of the decisive collective; time in its `sync_wait`
ranges (the host waiting for the collectives) is neither a phase nor `issue`. The lateness (late_ms) and
`transfer` stay measured on the arrival windows, so cause_ms (host time) can exceed late_ms where the GPU's
queue absorbed part of a host stall. A rank-step with no window on the host (no step range and no call of the
step before, as in a job without step ranges) keeps the parts of its arrival window.

A rank is *recurrently late* when it held at least half of the steps that had a straggler and more of them
than chance would give it: with each of the W ranks equally likely to be last, the binomial probability
of holding that many or more is below 1% / W (RECURRENT_P).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from analysis.collectives import straggler_window as win
from analysis.collectives.straggler_window import CAUSES, PHASE_PARTS
from analysis.trace.frames import KERNELS, NS_PER_MS

CAUSE_TEXT = {
    "data": "late data",
    "forward": "longer forward",
    "backward": "longer backward",
    "optimizer": "longer optimizer",
    "transfer": "slower transfer",
    "issue": "late host launch",
}
RECURRENT_P = 0.01  # divided by the world size: the chance a rank of an even run is flagged stays below 1%
RECURRENT_RULE = (
    "recurrently late: held at least half of the steps with a straggler, more than chance would give it "
    "(binomial tail with each rank equally likely last < 1% / ranks)"
)
SUMMARY_COLUMNS = ["rank", "steps_held", "steps", "wait_caused_ms", "causes", "recurrently_late"]


def with_causes(stragglers: pd.DataFrame, calls: pd.DataFrame, spans: pd.DataFrame) -> pd.DataFrame:
    """`stragglers` (one trace's) with cause, cause_ms and late_ms; `calls`: the trace's call rows of every
    rank, `spans`: its rank_spans."""
    out = stragglers.assign(cause=None, cause_ms=np.nan, late_ms=np.nan)
    held = stragglers.dropna(subset=["straggler"])
    paired = calls[calls["paired"]]
    if held.empty or paired.empty:
        return out
    rows, ranges = win.call_arrays(paired), win.RangeArrays.of(spans)
    steps, late = held["step"].to_numpy(np.int64), held["straggler"].to_numpy(np.int64)
    chosen = win.decisive(rows, steps, late, ranges)
    parts = win.window_parts(chosen, rows, win.RangeArrays.of(calls), ranges)
    if "source" in calls and (calls["source"] == KERNELS).any():
        parts = _host_led(parts, win.host_parts(chosen, rows, ranges))
    found = blame(parts)
    at = out["step"].isin(found["step"])  # steps whose straggler has a decisive collective
    found = found.set_index("step")
    for column in ("cause", "cause_ms", "late_ms"):
        out.loc[at, column] = out.loc[at, "step"].map(found[column]).to_numpy()
    return out


def _host_led(gpu: dict[str, np.ndarray], host: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """GPU traces: the phases and `issue` measured on the host's windows, the lateness (window_ns) and `transfer`
    on the arrival windows (kernel times); both hold the same rows. A rank-step with no window on the host (no
    step range and no call before it, as in a job without step ranges) keeps the parts of its arrival window."""
    on_host = host["window_ns"] > 0
    return gpu | {part: np.where(on_host, host[part], gpu[part]) for part in (*PHASE_PARTS, "issue")}


def blame(parts: dict[str, np.ndarray]) -> pd.DataFrame:
    """Per step: the straggler's excess over the others' median in each part -> cause, cause_ms, late_ms."""
    figures = ["window_ns", *CAUSES]
    is_late = parts["rank"] == parts["straggler"]
    steps = parts["step"][is_late]
    others = {f: _median_by(parts["step"][~is_late], parts[f][~is_late], steps) for f in figures}
    excess = np.column_stack([parts[f][is_late] - others[f] for f in figures])
    kept = ~np.isnan(excess).any(axis=1)  # steps whose straggler had others to compare with
    if not kept.any():
        return pd.DataFrame(columns=["step", "cause", "cause_ms", "late_ms"])
    values = excess[kept, 1:]
    best = values.argmax(axis=1)
    top = values[np.arange(len(best)), best]
    cause = np.where(top > 0, np.asarray(CAUSES, dtype=object)[best], None)
    return pd.DataFrame(
        {
            "step": steps[kept],
            "cause": cause,
            "cause_ms": np.where(top > 0, top / NS_PER_MS, np.nan),
            "late_ms": excess[kept, 0] / NS_PER_MS,
        }
    )


def _median_by(group: np.ndarray, values: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """The median of `values` in each group of `wanted` (NaN for a group with none)."""
    order = np.lexsort((values, group))
    group, values = group[order], values[order].astype(np.float64)
    known, first, count = np.unique(group, return_index=True, return_counts=True)
    median = (values[first + (count - 1) // 2] + values[first + count // 2]) / 2
    if known.size == 0:
        return np.full(len(wanted), np.nan)
    at = np.searchsorted(known, wanted).clip(0, len(known) - 1)
    return np.where(known[at] == wanted, median[at], np.nan)


def straggler_summary(stragglers: pd.DataFrame, world: int) -> pd.DataFrame:
    """Per rank that held a step (one trace): steps_held of the `steps` that had a straggler, the wait it
    caused the others (ms), its causes {cause: steps} and whether it is recurrently late (RECURRENT_RULE)."""
    held = stragglers.dropna(subset=["straggler"])
    if held.empty:
        return pd.DataFrame(columns=SUMMARY_COLUMNS)
    ranks, by_rank, steps_held = np.unique(
        held["straggler"].to_numpy(np.int64), return_inverse=True, return_counts=True
    )
    wait = pd.Series(held["wait_caused_ms"].to_numpy()).groupby(by_rank).sum()  # pandas' own sum, of its dtype
    out = pd.DataFrame({"rank": ranks, "steps_held": steps_held.astype(np.int64), "steps": len(held)})
    out["wait_caused_ms"] = wait.to_numpy()
    out["causes"] = _cause_counts(by_rank, held["cause"].fillna("unknown").to_numpy(object), len(ranks))
    out["recurrently_late"] = [recurrently_late(int(n), len(held), world) for n in steps_held]
    return out[SUMMARY_COLUMNS]


def _cause_counts(by_rank: np.ndarray, cause: np.ndarray, ranks: int) -> list[dict[str, int]]:
    """Per rank: {cause: steps}, the most frequent first (_most_first)."""
    names, by_cause = np.unique(cause.astype(str), return_inverse=True)
    counts = np.bincount(by_rank * len(names) + by_cause, minlength=ranks * len(names)).reshape(ranks, len(names))
    return [{str(names[c]): int(row[c]) for c in _most_first(row)} for row in counts]


def _most_first(counts: np.ndarray) -> np.ndarray:
    """The positions of the non-zero counts, largest first, ties ordered as a descending pandas sort_values of
    them in the causes' alphabetical order orders them (a reversed quicksort, not always stable)."""
    present = np.flatnonzero(counts)[::-1]
    return present[counts[present].argsort(kind="quicksort")][::-1]


def recurrently_late(held: int, steps: int, world: int) -> bool:
    """Whether holding `held` of `steps` steps is recurrent (RECURRENT_RULE) among `world` ranks."""
    if world < 2 or 2 * held < steps:
        return False
    p = 1.0 / world
    tail = sum(math.comb(steps, k) * p**k * (1 - p) ** (steps - k) for k in range(held, steps + 1))
    return tail < RECURRENT_P / world
