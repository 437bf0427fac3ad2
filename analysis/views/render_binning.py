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


def merge_subpixel(segments: pd.DataFrame, pixel_ns: float) -> pd.DataFrame:
    """Segments with sub-pixel work merged into blocks; adds/updates `count` and `busy` (ns) columns.

    A block spans its members and keeps the first member's other columns (name, phase, ...), so
    merging twice at the same resolution changes nothing. Wide segments are kept as they are.
    The input frame is not modified.
    """
    check_segments(segments, REQUIRED_FOR_MERGE)
    if not pixel_ns > 0:
        raise ValueError(f"pixel_ns must be > 0, got {pixel_ns!r}")
    duration = (segments["end"] - segments["start"]).to_numpy()
    count = segments["count"].to_numpy() if "count" in segments else np.ones(len(segments), np.int64)
    busy = segments["busy"].to_numpy() if "busy" in segments else duration
    seg = segments.assign(count=count.astype(np.int64), busy=busy.astype(np.int64))
    narrow = duration < pixel_ns
    wide = seg.loc[~narrow]
    small = seg.loc[narrow]
    if small.empty:
        return wide.reset_index(drop=True)
    small = small.sort_values(["lane", "category", "start"], kind="stable")
    group = ["lane", "category"]
    # A run breaks where the lane/category changes or a visible gap (>= 1 pixel) opens.
    grouped = small.groupby(group, sort=False, observed=True)
    reach = grouped["end"].cummax().to_numpy()
    group_id = grouped.ngroup().to_numpy()
    start = small["start"].to_numpy()
    new_run = np.ones(len(small), dtype=bool)
    new_run[1:] = (group_id[1:] != group_id[:-1]) | (start[1:] >= reach[:-1] + pixel_ns)
    # The runs are contiguous in `small`: reduce each one at its first row (numpy reduceat) instead
    # of a pandas groupby, which spent most of a report's timeline time on the "first" columns.
    first = np.flatnonzero(new_run)
    blocks = small.iloc[first].assign(
        start=np.minimum.reduceat(start, first),
        end=np.maximum.reduceat(small["end"].to_numpy(), first),
        count=np.add.reduceat(small["count"].to_numpy(), first),
        busy=np.add.reduceat(small["busy"].to_numpy(), first),
    )
    out = pd.concat([wide, blocks[wide.columns]], ignore_index=True)
    return out.sort_values(["lane", "start"], kind="stable").reset_index(drop=True)
