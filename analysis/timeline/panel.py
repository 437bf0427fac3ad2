"""A timeline panel: one trace's picture as frames (segments on lanes, overlap periods, highlight spans,
its time origin and window), what lanes.py builds and figure.py draws; no plotly here. And its level
of detail (`merge_subpixel`): work narrower than a pixel merged into aggregated blocks.

A lane of a 1M-kernel trace cannot be drawn segment by segment in a browser; nor can the eye see
a 2 us kernel in a 2 s window. Segments shorter than one pixel (at the chosen window and width)
that follow each other with gaps shorter than a pixel are merged, per (lane, category), into one
block that carries the member count and the busy time. A gap the eye could see (>= 1 pixel)
always separates blocks, so a lane holds at most about one block per pixel column however large
the trace, and usually far fewer: a busy stream becomes one bar per busy stretch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

# The generic input of the renderer: one row per drawable interval (times in ns; name, phase, stream: strings).
SEGMENT_COLUMNS = ("lane", "start", "end", "category", "name", "phase", "stream")
REQUIRED_FOR_MERGE = ("lane", "start", "end", "category")


def check_segments(segments: pd.DataFrame, required: tuple[str, ...] = SEGMENT_COLUMNS) -> None:
    """Raise ValueError naming the missing columns of a segments frame."""
    missing = [c for c in required if c not in segments.columns]
    if missing:
        raise ValueError(f"segments frame lacks columns {missing}")


@dataclass(frozen=True)
class Panel:
    """One trace's picture: segments on lanes, overlap periods, and the time origin (all ns)."""

    title: str
    segments: pd.DataFrame  # SEGMENT_COLUMNS, optionally count/busy
    lanes: pd.DataFrame  # lane (0..n-1, top to bottom), label, rank
    origin_ns: int
    window_ns: tuple[int, int]
    overlap: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=["rank", "start", "end"]))
    merged_pixel_ns: float | None = None  # the resolution the segments were already merged at, if any
    overview: Panel | None = None  # the whole run on the same lanes and origin, shown by the "whole run" button
    # Spans drawn as a band behind one rank's lanes (rank, start, end in ns): each step's backward pass.
    highlight: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=["rank", "start", "end"]))
    highlight_name: str = "backward pass"
    # (step, start, end) in ns of each step over the drawn ranks, and the title naming that step's figures
    # (timeline_page.py fills it in), for the step switch (figure.py)
    steps: tuple[tuple[int, int, int, str], ...] = ()
    # Other views of the same run (its other steps or ranks) the panel's drop-down switches to, as (label,
    # panel), the opened view itself as (label, None): render/drop_downs.py; a panel has these or an overview
    choices: tuple[tuple[str, Panel | None], ...] = ()

    def __post_init__(self) -> None:
        check_segments(self.segments)
        for col in ("lane", "label", "rank"):
            if col not in self.lanes.columns:
                raise ValueError(f"panel {self.title!r}: lanes frame lacks column {col!r}")
        if self.choices and (self.overview is not None or sum(c is None for _, c in self.choices) != 1):
            raise ValueError(f"panel {self.title!r}: choices need one opened view (None) and no overview")
        if not self.window_ns[1] > self.window_ns[0]:
            raise ValueError(f"panel {self.title!r}: empty window {self.window_ns!r}")


def panel_pixel_ns(panel: Panel, width_px: int) -> float:
    """Nanoseconds covered by one pixel when the panel's whole window spans `width_px`."""
    return (panel.window_ns[1] - panel.window_ns[0]) / width_px


def _sort_codes(values: pd.Series) -> np.ndarray:
    """Integers that sort as the column sorts: a categorical's codes, else the sorted distinct values' ranks."""
    if isinstance(values.dtype, pd.CategoricalDtype):
        return values.cat.codes.to_numpy()
    return pd.factorize(values, sort=True)[0]


def _cummax_by_run(values: np.ndarray, run_start: np.ndarray) -> np.ndarray:
    """Running maximum of integer `values`, restarting where `run_start` is True (the first element starts
    one). Each run is lifted above every earlier one (by its number times the values' span), so one
    numpy running maximum restarts at each run; a pandas groupby costs more than the merge around it."""
    if values.size == 0:
        return values.copy()
    run = np.cumsum(run_start, dtype=np.int64)
    lo, span = int(values.min()), int(values.max()) - int(values.min()) + 1
    if span * (int(run[-1]) + 1) >= 2**62:  # the lifted values would not fit in int64
        return pd.Series(values).groupby(run).cummax().to_numpy()
    lift = run * span
    return np.maximum.accumulate(values - lo + lift) - lift + lo


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
