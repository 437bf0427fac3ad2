"""A timeline panel: one trace's picture as frames (segments on lanes, overlap periods, highlight spans,
its time origin and window), what lanes.py builds and render_figure.py draws; no plotly here."""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from analysis.timeline.render_binning import check_segments


@dataclass(frozen=True)
class Panel:
    """One trace's picture: segments on lanes, overlap periods, and the time origin (all ns)."""

    title: str
    segments: pd.DataFrame  # render_binning.SEGMENT_COLUMNS, optionally count/busy
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
    # (timeline_page.py fills it in), for the step switch (render_figure.py)
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
