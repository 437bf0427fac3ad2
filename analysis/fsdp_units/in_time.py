"""Did each collective finish in time for the compute that needed it? `waited_ns` per call (the CPU
definition); from the gather rows (gather_rows.py, either definition) `in_time_sentences`: the answer
for sharded weights' all-gathers, per phase, in words, and `unit_table`: per phase and unit, worst first.

waited  how long before the call completed its rank had stopped computing: end - max(start, the end of
        the rank's last compute at or before the call's end); 0 when compute ran right up to the
        completion (the data arrived before anything had to wait for it). For a weight all-gather this
        is the time the next layer's compute waited for its weights; unlike the exposed time it does
        not count idle gaps earlier in the call that had other causes.
late    waited > LATE_NS (10 µs: the gaps between consecutive kernels or ops are not waiting).
Per phase (forward, backward), over the all-gathers of one rank in one step, averaged over every
rank-step: a layer (the call's tag, its module; "(root)" where it has none) is late when its mean
held (GPU) or waited (CPU) time per rank-step exceeds LATE_NS; the late ones cost the sum of their
means per step. Each sentence starts with the definition its figures use.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike

from analysis.fsdp_units.gather_cause import CAUSE_TEXT, CPU_LATE, HOST, IN_TIME, LATE_CAUSES, LATE_NS, UNMARKED
from analysis.measure import intervals as iv
from analysis.trace.frames import NS_PER_MS

UNIT_COLUMNS = ["phase", "unit", "order", "held_ms_per_step", "late", "gathers", "cause", "host", "queued_behind"]


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


def layer_waits(gathers: pd.DataFrame) -> pd.DataFrame:
    """Per unit of one phase's gather rows (rank, step, unit, held_ms): mean held (or waited) ms per
    rank-step, sorted worst first. Rank-steps: those with any of these rows."""
    rank_steps = len(gathers[["rank", "step"]].drop_duplicates())
    per = gathers.groupby("unit", sort=False)["held_ms"].sum() / max(rank_steps, 1)
    return per.rename("held_ms").sort_values(ascending=False, kind="stable").reset_index()


def _cause_counts(gathers: pd.DataFrame) -> str:
    """'late gathers by cause: partner 828, issued late 1; host 871 (...)' ('' on CPU rows)."""
    counts = gathers["cause"].value_counts()
    late = [f"{c} {int(counts[c])}" for c in LATE_CAUSES if counts.get(c, 0)]
    out = f"; late gathers by cause: {', '.join(late)}" if late else ""
    if counts.get(HOST, 0):
        out += f"; {HOST} {int(counts[HOST])} ({CAUSE_TEXT[HOST]}: held 0)"
    if counts.get(UNMARKED, 0):
        out += f"; {int(counts[UNMARKED])} {CAUSE_TEXT[UNMARKED]}"
    return out


def in_time_sentence(gathers: pd.DataFrame, phase: str) -> str:
    """'waited (CPU): all-gathers in time for 46 of 48 layers in forward; the late ones cost 1.9 ms/step;
    worst: layers.0.attn.wq (1.2 ms)' from one phase's gather rows (gather_rows.py: rank, step, unit,
    held_ms, cause, definition); GPU rows add the count of late gathers per cause."""
    definition = str(gathers["definition"].iloc[0]) if len(gathers) else ""
    measured = gathers[gathers["cause"] != UNMARKED]
    if measured.empty:
        return (
            f"{definition}: not measured for the {len(gathers)} all-gathers in {phase}: the trace marks no "
            "comm_wait:all_gather ranges (PyTorch's FSDP2 does not; see docs/fsdp.md)"
        )
    layers = layer_waits(measured)
    late = layers[layers["held_ms"] > LATE_NS / NS_PER_MS]
    head = f"{definition}: all-gathers in time for {len(layers) - len(late)} of {len(layers)} layers in {phase}"
    tail = _cause_counts(gathers)
    if late.empty:
        return head + tail
    worst = late.iloc[0]
    cost = float(late["held_ms"].sum())
    return f"{head}; the late ones cost {cost:.3g} ms/step; worst: {worst['unit']} ({worst['held_ms']:.3g} ms){tail}"


def in_time_sentences(gathers: pd.DataFrame) -> list[str]:
    """The sentence for each phase (forward, then backward) that has gather rows (gather_rows.py)."""
    out = []
    for phase in ("forward", "backward"):
        mine = gathers[gathers["phase"] == phase]
        if len(mine):
            out.append(in_time_sentence(mine, phase))
    return out


def unit_table(gathers: pd.DataFrame) -> pd.DataFrame:
    """Per phase and unit of gather rows, worst first: held ms per rank-step, gathers late of all, the
    most frequent cause among the late ones (else host when any, else in time), the collective the
    late ones most often queued behind, and the unit's place in forward order (`order`, from 1)."""
    if gathers.empty:
        return pd.DataFrame(columns=UNIT_COLUMNS)
    rank_steps = gathers.groupby("phase")[["rank", "step"]].apply(lambda f: len(f.drop_duplicates()))
    late = gathers["cause"].isin([*LATE_CAUSES, CPU_LATE])
    g = gathers.assign(late=late, host=gathers["cause"] == HOST)
    per = g.groupby(["phase", "unit"], sort=False).agg(
        held=("held_ms", "sum"), late=("late", "sum"), gathers=("held_ms", "size"), host=("host", "sum"),
        first=("issue_ns", "min"),
    )  # fmt: skip
    per["held_ms_per_step"] = per.pop("held") / per.index.get_level_values("phase").map(rank_steps).to_numpy()
    main = _most_frequent(g[late], "cause")
    behind = _most_frequent(g[late & (g["queued_behind"] != "")], "queued_behind")
    per = per.join(main.rename("cause")).join(behind.rename("queued_behind")).reset_index()
    fallback = np.where(per["host"] > 0, HOST, IN_TIME)
    per["cause"] = per["cause"].fillna(pd.Series(fallback, index=per.index))
    per["queued_behind"] = per["queued_behind"].fillna("")
    forward = per[per["phase"] == "forward"].sort_values("first")
    order = dict(zip(forward["unit"], range(1, len(forward) + 1), strict=True))
    per["order"] = per["unit"].map(order).fillna(0).astype(int)
    per = per.sort_values(["held_ms_per_step", "phase"], ascending=[False, False], kind="stable")
    return per[UNIT_COLUMNS].reset_index(drop=True)


def _most_frequent(frame: pd.DataFrame, column: str) -> pd.Series:
    """Per (phase, unit): the most frequent value of `column` (first in the frame's order on a tie)."""
    counts = frame.groupby(["phase", "unit", column], sort=False).size().rename("n").reset_index()
    top = counts.sort_values("n", ascending=False, kind="stable").drop_duplicates(["phase", "unit"])
    return top.set_index(["phase", "unit"])[column]
