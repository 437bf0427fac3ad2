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
the start of backward as time in no range. There the phases and the host gap are measured on the host's
clock instead (host_parts): each rank's window runs from its issue of its last collective of the step before
(its step's start without one) to its issue of the decisive collective; time in its `sync_wait` ranges (the
host waiting for the collectives) is neither a phase nor `issue`. The lateness (late_ms) and `transfer` stay
measured on the arrival windows, so cause_ms (host time) can exceed late_ms where the GPU's queue absorbed
part of a host stall. A rank-step with no window on the host (no step range and no call of the step before,
as in a job without step ranges) keeps the parts of its arrival window.

A rank is *recurrently late* when it held at least half of the steps that had a straggler and more of them
than chance would give it: with each of the W ranks equally likely to be last, the binomial probability
of holding that many or more is below 1% / W (RECURRENT_P).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from analysis.measure import intervals as iv
from analysis.measure.rank_spans import SYNC_WAIT
from analysis.trace.frames import KERNELS, NS_PER_MS

PHASE_PARTS = ("data", "forward", "backward", "optimizer")
CAUSES = (*PHASE_PARTS, "transfer", "issue")
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
    chosen = decisive(paired, held.astype({"straggler": np.int64}), spans)
    parts = window_parts(chosen, paired, calls, spans)
    if "source" in calls and (calls["source"] == KERNELS).any():
        parts = _host_led(parts, host_parts(chosen, paired, spans))
    found = blame(parts).set_index("step")
    at = out["step"].isin(found.index)  # steps whose straggler has a decisive collective
    for column in ("cause", "cause_ms", "late_ms"):
        out.loc[at, column] = out.loc[at, "step"].map(found[column]).to_numpy()
    return out


def decisive(paired: pd.DataFrame, held: pd.DataFrame, spans: pd.DataFrame) -> pd.DataFrame:
    """Per step with a straggler: op, step, seq of its decisive collective, the straggler and the anchor (ns)."""
    key = call_key(paired)
    caused = paired.groupby([*key, "last_rank"], as_index=False).agg(caused=("wait_ms", "sum"))
    caused = caused.merge(held[["step", "straggler"]], left_on=["step", "last_rank"], right_on=["step", "straggler"])
    top = caused.sort_values(["step", "caused"], ascending=[True, False], kind="stable").drop_duplicates("step")
    own = paired[[*key, "rank", "start_ns"]].rename(columns={"rank": "straggler", "start_ns": "own_start"})
    top = top.merge(own, on=[*key, "straggler"]).merge(
        paired.groupby(key, as_index=False).agg(earliest=("start_ns", "min")), on=key
    )
    top["anchor"] = top["step"].map(_anchors(top, paired))
    steps = spans[spans["kind"] == "step"].groupby("step")["start_ns"].min()  # the earliest start among the ranks
    top["anchor"] = top["anchor"].fillna(top["step"].map(steps))
    return top.dropna(subset=["anchor"]).astype({"anchor": np.int64})[[*key, "straggler", "anchor"]]


def call_key(paired: pd.DataFrame) -> list[str]:
    """The columns naming one collective: op, step, seq, and its group's members where calls carry groups (two
    groups' k-th all-reduces of a step are two collectives)."""
    return ["op", "step", "seq", *(["group_ranks"] if "group_ranks" in paired else [])]


def _anchors(top: pd.DataFrame, paired: pd.DataFrame) -> pd.Series:
    """Per step: the latest last arrival, at or before every rank's arrival at the decisive collective, among the
    collectives of that step or the one before that the straggler saw complete before its own arrival: the
    latest instant all ranks were in step. An async call still in flight, or one the others had already left
    behind (they issued the decisive call before it completed), is no such instant."""
    mine = paired[["rank", "step", "end_ns", "last_arrival_ns"]]
    pairs = pd.concat(
        [top.assign(at=top["step"] - back) for back in (0, 1)], ignore_index=True
    )  # the step and the one before it
    cand = pairs.merge(mine, left_on=["straggler", "at"], right_on=["rank", "step"], suffixes=("", "_call"))
    ok = (cand["end_ns"] < cand["own_start"]) & (cand["last_arrival_ns"] <= cand["earliest"])
    return cand[ok].groupby("step")["last_arrival_ns"].max()


def window_parts(chosen: pd.DataFrame, paired: pd.DataFrame, calls: pd.DataFrame, spans: pd.DataFrame) -> pd.DataFrame:
    """One row per (decisive collective, rank): step, rank, straggler, window_ns and the ns of each of CAUSES, each
    rank's window from the anchor to its arrival at the decisive collective."""
    key = call_key(paired)
    rows = chosen.merge(paired[[*key, "rank", "start_ns"]], on=key)
    lo = rows["anchor"].to_numpy(np.int64)
    hi = np.maximum(rows["start_ns"].to_numpy(np.int64), lo)
    out = split_window(rows["rank"].to_numpy(), lo, hi, spans, calls)
    return rows[["step", "rank", "straggler"]].assign(window_ns=hi - lo, **out)


def host_parts(chosen: pd.DataFrame, paired: pd.DataFrame, spans: pd.DataFrame) -> pd.DataFrame:
    """window_parts on the host's clock (GPU traces, where the host runs ahead of its GPU): each rank's window
    from its issue of its last collective of the step before (its step's start without one) to its issue of the
    decisive collective; the ns of each phase, `transfer` (in its `sync_wait` ranges outside the phases: the host
    waiting for the collectives) and `issue` (in none of those ranges)."""
    key = call_key(paired)
    rows = chosen.merge(paired[[*key, "rank", "issue_ns"]], on=key)
    last = paired.groupby(["rank", "step"], as_index=False)["issue_ns"].max().rename(columns={"issue_ns": "before"})
    rows = rows.merge(last.assign(step=last["step"] + 1), on=["rank", "step"], how="left")
    starts = spans[spans["kind"] == "step"][["rank", "step", "start_ns"]].drop_duplicates(["rank", "step"])
    rows = rows.merge(starts, on=["rank", "step"], how="left")
    hi = rows["issue_ns"].to_numpy(np.int64)
    lo = rows["before"].fillna(rows["start_ns"]).to_numpy(np.float64)
    lo = np.where(np.isnan(lo), hi, np.minimum(lo, hi)).astype(np.int64)
    waits = spans[spans["kind"] == SYNC_WAIT]  # the host waiting for the collectives: neither a phase nor a stall
    out = split_window(rows["rank"].to_numpy(), lo, hi, spans, waits)
    return rows[["step", "rank", "straggler"]].assign(window_ns=hi - lo, **out)


def split_window(
    rank_of: np.ndarray, lo: np.ndarray, hi: np.ndarray, spans: pd.DataFrame, calls: pd.DataFrame | None
) -> dict[str, np.ndarray]:
    """Per window [lo, hi) of a rank: ns inside each phase's ranges, inside the rank's `calls` outside those
    (`transfer`; none without calls) and inside none of them (`issue`)."""
    out = {part: np.zeros(len(lo), dtype=np.int64) for part in CAUSES}
    for rank in np.unique(rank_of):  # one iteration per rank: its ranges' unions, every window at once
        mine = np.flatnonzero(rank_of == rank)
        own = spans[spans["rank"] == rank]
        phase_sets = {k: iv.union(*_bounds(own[own["kind"] == k])) for k in PHASE_PARTS}
        phases = iv.union(*_bounds(own[own["kind"].isin(PHASE_PARTS)]))
        mine_calls = calls[calls["rank"] == rank] if calls is not None else calls
        comm = iv.subtract(*iv.union(*_bounds(mine_calls)), *phases) if mine_calls is not None else (iv.EMPTY, iv.EMPTY)
        for part, (s, e) in (*phase_sets.items(), ("transfer", comm)):
            out[part][mine] = iv.overlap_lengths(lo[mine], hi[mine], s, e)
        everything = iv.union(np.r_[phases[0], comm[0]], np.r_[phases[1], comm[1]])
        out["issue"][mine] = (hi[mine] - lo[mine]) - iv.overlap_lengths(lo[mine], hi[mine], *everything)
    return out


def _host_led(gpu: pd.DataFrame, host: pd.DataFrame) -> pd.DataFrame:
    """GPU traces: the phases and `issue` measured on the host's windows, the lateness (window_ns) and `transfer`
    on the arrival windows (kernel times). A rank-step with no window on the host (no step range and no call
    before it, as in a job without step ranges) keeps the parts measured on its arrival window."""
    keys, parts = ["step", "rank"], [*PHASE_PARTS, "issue"]
    windows = host.loc[host["window_ns"] > 0, [*keys, *parts]]
    on_host = gpu[[*keys, "straggler", "window_ns", "transfer", *parts]].merge(
        windows, on=keys, how="left", suffixes=("_gpu", "")
    )
    for part in parts:
        on_host[part] = on_host[part].fillna(on_host[f"{part}_gpu"])
    return on_host[[*keys, "straggler", "window_ns", "transfer", *parts]].astype(dict.fromkeys(parts, np.int64))


def _bounds(frame: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    return frame["start_ns"].to_numpy(np.int64), frame["end_ns"].to_numpy(np.int64)


def blame(parts: pd.DataFrame) -> pd.DataFrame:
    """Per step: the straggler's excess over the others' median in each part -> cause, cause_ms, late_ms."""
    figures = ["window_ns", *CAUSES]
    is_late = parts["rank"] == parts["straggler"]
    others = parts[~is_late].groupby("step")[figures].median()
    late = parts[is_late].set_index("step")[figures]
    excess = (late - others.reindex(late.index)).dropna()
    if excess.empty:
        return pd.DataFrame(columns=["step", "cause", "cause_ms", "late_ms"])
    values = excess[list(CAUSES)].to_numpy(float)
    best = values.argmax(axis=1)
    top = values[np.arange(len(best)), best]
    cause = np.where(top > 0, np.asarray(CAUSES, dtype=object)[best], None)
    return pd.DataFrame(
        {
            "step": excess.index.to_numpy(),
            "cause": cause,
            "cause_ms": np.where(top > 0, top / NS_PER_MS, np.nan),
            "late_ms": excess["window_ns"].to_numpy(float) / NS_PER_MS,
        }
    )


def straggler_summary(stragglers: pd.DataFrame, world: int) -> pd.DataFrame:
    """Per rank that held a step (one trace): steps_held of the `steps` that had a straggler, the wait it
    caused the others (ms), its causes {cause: steps} and whether it is recurrently late (RECURRENT_RULE)."""
    held = stragglers.dropna(subset=["straggler"])
    if held.empty:
        return pd.DataFrame(columns=SUMMARY_COLUMNS)
    steps = len(held)
    by_rank = held.groupby(held["straggler"].astype(np.int64))
    out = by_rank.agg(steps_held=("step", "size"), wait_caused_ms=("wait_caused_ms", "sum")).reset_index()
    out = out.rename(columns={"straggler": "rank"}).assign(steps=steps)
    causes = held.assign(cause=held["cause"].fillna("unknown")).groupby(["straggler", "cause"]).size()
    out["causes"] = [
        {str(c): int(n) for c, n in causes.loc[r].sort_values(ascending=False).items()} for r in out["rank"]
    ]  # one dict per rank that held a step
    out["recurrently_late"] = [recurrently_late(int(n), steps, world) for n in out["steps_held"]]
    return out[SUMMARY_COLUMNS]


def recurrently_late(held: int, steps: int, world: int) -> bool:
    """Whether holding `held` of `steps` steps is recurrent (RECURRENT_RULE) among `world` ranks."""
    if world < 2 or 2 * held < steps:
        return False
    p = 1.0 / world
    tail = sum(math.comb(steps, k) * p**k * (1 - p) ** (steps - k) for k in range(held, steps + 1))
    return tail < RECURRENT_P / world
