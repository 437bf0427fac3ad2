"""Did each collective finish in time for the compute that needed it? `waited_ns` per call, and
`in_time_sentences`: the answer for sharded weights' all-gathers, per phase, in words.

waited  how long before the call completed its rank had stopped computing: end - max(start, the end of
        the rank's last compute at or before the call's end); 0 when compute ran right up to the
        completion (the data arrived before anything had to wait for it). For a weight all-gather this
        is the time the next layer's compute waited for its weights; unlike the exposed time it does
        not count idle gaps earlier in the call that had other causes.
late    waited > LATE_NS (10 µs: the gaps between consecutive kernels or ops are not waiting).
Per phase (forward, backward), over the all-gathers of one rank in one step, averaged over every
rank-step: a layer (the call's tag, its module; "(root)" where it has none) is late when its mean
wait per rank-step exceeds LATE_NS; the late ones cost the sum of their mean waits per step.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike

from analysis.frames.trace import NS_PER_MS
from analysis.measures import intervals as iv

LATE_NS = 10_000


def waited_ns(start: ArrayLike, end: ArrayLike, compute: iv.Set) -> np.ndarray:
    """Per call [start, end): end - max(start, last end of compute at or before end), 0 where the
    canonical compute set covers the instant just before end."""
    s, e = np.asarray(start, dtype=np.int64), np.asarray(end, dtype=np.int64)
    cs, ce = compute
    if cs.size == 0:
        return np.maximum(e - s, 0)
    i = np.searchsorted(cs, e, side="left") - 1  # the last compute piece starting before the end
    has = i >= 0
    last_end = np.where(has, ce[np.maximum(i, 0)], np.iinfo(np.int64).min)
    covered = has & (last_end >= e)
    return np.where(covered, 0, e - np.maximum(s, np.minimum(last_end, e))).clip(min=0)


def waited_by_rank(rows: pd.DataFrame, compute: dict) -> np.ndarray:
    """waited_ns of each row (rank, start_ns, end_ns) against its rank's compute set."""
    out = np.zeros(len(rows), dtype=np.int64)
    for rank, at in rows.groupby("rank", sort=False).indices.items():  # one iteration per rank
        mine = rows.iloc[at]
        out[at] = waited_ns(mine["start_ns"], mine["end_ns"], compute.get(int(rank), (iv.EMPTY, iv.EMPTY)))
    return out


def layer_waits(calls: pd.DataFrame) -> pd.DataFrame:
    """Per layer (tag) of all-gather calls (rank, step, tag, waited_ms): mean wait per rank-step, sorted
    worst first. Rank-steps: those with any of these calls."""
    rank_steps = len(calls[["rank", "step"]].drop_duplicates())
    tags = calls["tag"].astype(str).replace("", "(root)")
    per = calls.assign(tag=tags).groupby("tag")["waited_ms"].sum() / max(rank_steps, 1)
    return per.rename("waited_ms").sort_values(ascending=False, kind="stable").reset_index()


def in_time_sentence(calls: pd.DataFrame, phase: str) -> str:
    """'all-gathers in time for 46 of 48 layers in forward; the late ones cost 1.9 ms/step; worst:
    layers.0.attn.wq (1.2 ms)' from one phase's all-gather calls (rank, step, tag, waited_ms)."""
    layers = layer_waits(calls)
    late = layers[layers["waited_ms"] > LATE_NS / NS_PER_MS]
    head = f"all-gathers in time for {len(layers) - len(late)} of {len(layers)} layers in {phase}"
    if late.empty:
        return head
    worst = late.iloc[0]
    cost = float(late["waited_ms"].sum())
    return f"{head}; the late ones cost {cost:.3g} ms/step; worst: {worst['tag']} ({worst['waited_ms']:.3g} ms)"


def in_time_sentences(calls: pd.DataFrame, phases: np.ndarray) -> list[str]:
    """The sentence for the all-gathers of each phase (forward, then backward) that has any; `calls`:
    rows with op, rank, step, tag, waited_ms; `phases`: each row's phase (op_phase.phase_labels)."""
    gathers = calls["op"].to_numpy() == "all_gather"
    in_steps = calls["step"].to_numpy() >= 0
    out = []
    for phase in ("forward", "backward"):
        mine = calls[gathers & in_steps & (phases == phase)]
        if len(mine):
            out.append(in_time_sentence(mine, phase))
    return out
