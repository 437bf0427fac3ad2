"""Questions asked of a rank's measured activity (activity.RankWork): where its communication lies
under its compute (`overlap_periods`) and where not (`exposed_periods`), its compute as one set per
rank (`compute_sets`), and each step's backward compute window (`backward_windows`)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.measure import intervals as iv
from analysis.measure.activity import RankActivity, RankWork


def _comm_in_view(work: RankWork, step: int | None, lo: int | None, hi: int | None) -> tuple[RankActivity, iv.Set]:
    """The activity the step (or the whole capture) is measured on, and the union of the communication
    launched in `step` (all of it when None) clipped to [lo, hi)."""
    act = work.whole if step is None else work.steps
    comm = act.comm
    if step is not None:
        index = np.flatnonzero(work.windows["step"].to_numpy() == step)
        comm = comm.of_window(int(index[0]) if index.size else -2)
    starts, ends = comm.start, comm.end
    if lo is not None and hi is not None:
        starts, ends = iv.clip(starts, ends, lo, hi)
    return act, iv.union(starts, ends)


def overlap_periods(work: RankWork, step: int | None = None, lo: int | None = None, hi: int | None = None) -> iv.Set:
    """Where the rank's communication lies under its compute: the communication launched in `step`
    (all of it when None), clipped to [lo, hi), intersected with all of the rank's compute. Its
    measure over a step is that step's overlap_ms (metrics.window_metrics)."""
    act, comm = _comm_in_view(work, step, lo, hi)
    return iv.intersect(*comm, *act.compute.as_set())


def exposed_periods(work: RankWork, step: int | None = None, lo: int | None = None, hi: int | None = None) -> iv.Set:
    """The rest of that communication: where none of the rank's compute is under it. Its measure over a
    step is that step's exposed_comm_ms (comm_ms - overlap_ms)."""
    act, comm = _comm_in_view(work, step, lo, hi)
    return iv.subtract(*comm, *act.compute.as_set())


def compute_sets(works: list[RankWork]) -> dict[int, iv.Set]:
    """rank -> the union of its compute over the whole capture."""
    return {w.rank: w.whole.compute.as_set() for w in works}


def backward_windows(works: list[RankWork]) -> pd.DataFrame:
    """rank, step, start, end: each step's backward compute on its rank (its backward items' first start
    and last end)."""
    frames = []
    for w in works:  # one per rank
        items = w.steps.backward
        keep = items.window >= 0
        f = pd.DataFrame({"window": items.window[keep], "start": items.start[keep], "end": items.end[keep]})
        g = f.groupby("window").agg(start=("start", "min"), end=("end", "max"))
        g["step"] = w.windows["step"].to_numpy()[g.index.to_numpy()]
        frames.append(g.assign(rank=w.rank).reset_index(drop=True))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=["rank", "step", "start", "end"])
