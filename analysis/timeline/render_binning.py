"""Level of detail for timelines: merge work narrower than a pixel into aggregated blocks.

A lane of a 1M-kernel trace cannot be drawn segment by segment in a browser; nor can the eye see
a 2 us kernel in a 2 s window. Segments shorter than one pixel (at the chosen window and width)
that follow each other with gaps shorter than a pixel are merged, per (lane, category), into one
block that carries the member count and the busy time. A gap the eye could see (>= 1 pixel)
always separates blocks, so a lane holds at most about one block per pixel column however large
the trace, and usually far fewer: a busy stream becomes one bar per busy stretch.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

# The generic input of the renderer: one row per drawable interval (times in ns).
SEGMENT_COLUMNS = ("lane", "start", "end", "category", "name", "phase", "stream")
REQUIRED_FOR_MERGE = ("lane", "start", "end", "category")


def check_segments(segments: pd.DataFrame, required: tuple[str, ...] = SEGMENT_COLUMNS) -> None:
    """Raise ValueError naming the missing columns of a segments frame."""
    missing = [c for c in required if c not in segments.columns]
    if missing:
        raise ValueError(f"segments frame lacks columns {missing}")


def _sort_codes(values: pd.Series) -> np.ndarray:
    """Integers that sort as the column sorts: a categorical's codes, else the sorted distinct values' ranks."""
    if isinstance(values.dtype, pd.CategoricalDtype):
        return values.cat.codes.to_numpy()
    return pd.factorize(values, sort=True)[0]


def _cummax_by_run(values: np.ndarray, run_start: np.ndarray) -> np.ndarray:
    """Running maximum of `values`, restarting where `run_start` is True (the first element starts one)."""
    return pd.Series(values).groupby(np.cumsum(run_start)).cummax().to_numpy()


def merge_subpixel(segments: pd.DataFrame, pixel_ns: float) -> pd.DataFrame:
    """Segments with sub-pixel work merged into blocks; adds/updates `count` and `busy` (ns) columns.

    A block spans its members and keeps the first member's other columns (name, phase, ...), so
    merging twice at the same resolution changes nothing. Wide segments are kept as they are.
    When anything is merged the result is sorted by lane and start (stably, wide segments first); the
    input frame is not modified.
    """
    check_segments(segments, REQUIRED_FOR_MERGE)
    if not pixel_ns > 0:
        raise ValueError(f"pixel_ns must be > 0, got {pixel_ns!r}")
    start, end = segments["start"].to_numpy(), segments["end"].to_numpy()
    lane = segments["lane"].to_numpy()
    duration = end - start
    count = segments["count"].to_numpy() if "count" in segments else np.ones(len(segments), np.int64)
    busy = segments["busy"].to_numpy() if "busy" in segments else duration
    count, busy = count.astype(np.int64), busy.astype(np.int64)
    narrow = duration < pixel_ns
    if not narrow.any():
        return segments.assign(count=count, busy=busy).reset_index(drop=True)  # as they came
    wide = np.flatnonzero(~narrow)
    # The narrow ones by (lane, category, start), stably; numpy on arrays, the frame is taken once at the end.
    small = np.flatnonzero(narrow)
    category = _sort_codes(segments["category"])
    small = small[np.lexsort((start[small], category[small], lane[small]))]
    s, e = start[small], end[small]
    # A run breaks where the lane/category changes or a visible gap (>= 1 pixel) opens.
    group_start = np.ones(small.size, dtype=bool)
    group_start[1:] = (lane[small][1:] != lane[small][:-1]) | (category[small][1:] != category[small][:-1])
    reach = _cummax_by_run(e.astype(np.int64), group_start)
    new_run = group_start.copy()
    new_run[1:] |= s[1:] >= reach[:-1] + pixel_ns
    # The runs are contiguous: reduce each at its first row (numpy reduceat) instead of a pandas groupby.
    first = np.flatnonzero(new_run)
    rows = np.concatenate([wide, small[first]])
    merged = (
        np.minimum.reduceat(s, first),
        np.maximum.reduceat(e, first),
        np.add.reduceat(count[small], first),
        np.add.reduceat(busy[small], first),
    )
    new = [np.concatenate([x[wide], m]) for x, m in zip((start, end, count, busy), merged, strict=True)]
    order = np.lexsort((new[0], lane[rows]))  # by lane, then start; stable
    return (
        segments.iloc[rows[order]]
        .assign(start=new[0][order], end=new[1][order], count=new[2][order], busy=new[3][order])
        .reset_index(drop=True)
    )
