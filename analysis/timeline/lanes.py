"""From a loaded trace to a timeline panel: lanes per rank, segments, the overlap strip.

Lanes of each rank, top to bottom: CPU `step N` ranges, CPU phases (forward/backward/optimizer/
grad_sync), CPU communication ranges (`comm:*`, NCCL/gloo ranges; async ones from issue to
completion, whichever thread ends them), other NVTX ranges, then per GPU stream a compute lane and
a communication lane, then the rank's overlap strip. The strip is the analysis' own
(measure/rank_periods.py: overlap_periods, exposed_periods): the rank's communication (GPU kernels and
copies; comm ranges where collectives run on the host; CPU-only ranks: comm ranges), hidden where
its compute (GPU kernels; CPU-only ranks: forward/backward/optimizer minus blocking comm and
gradient-sync waits) lies under it, exposed elsewhere. A step view spans the GPU-aware step
(analysis.measure.phases: step_windows) and everything launched in it, and its strip holds the communication
launched in that step, so its hidden part equals that step's overlap_ms and its exposed part the
step's exposed_comm_ms; the whole-run view holds all communication.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from analysis.errors import TraceError
from analysis.measure.activity import RankWork
from analysis.run.loaded_run import LoadedRun
from analysis.timeline.lane_segments import (
    GROUP_LABELS,
    STRIP,
    RankRanges,
    colour_by_phase,
    gpu_segments,
    names_of,
    nvtx_segments,
    phase_labels,
    rank_ranges,
    streams_of,
    strip_segments,
)
from analysis.timeline.panel import Panel, merge_subpixel
from analysis.timeline.style import HIDDEN
from analysis.trace.frames import Trace


@dataclass(frozen=True)
class Selection:
    """Which part of a trace to draw: one step (None: all) and one rank (None: all)."""

    step: int | None = None
    rank: int | None = None

    def __post_init__(self) -> None:
        for name in ("step", "rank"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 0):
                raise TraceError(f"--{name} {value!r}: expected a non-negative integer")


def _window(cpu: pd.DataFrame, seg: pd.DataFrame, step: int | None, where: str, works: list) -> tuple[int, int, int]:
    """(origin, window start, window end) in ns: the chosen step (from its start to the later of its
    window end and the end of the work launched in it, over the drawn ranks), or the whole selection."""
    if step is not None:
        chosen = [w.windows.loc[w.windows["step"] == step] for w in works]
        chosen = pd.concat(chosen) if chosen else pd.DataFrame(columns=["start", "work_end"])
        if chosen.empty:
            have = sorted(set(cpu.loc[cpu["category"] == "step", "step"].tolist()))
            hint = f"steps present: {have[0]}..{have[-1]}" if have else "it has no `step N` ranges; omit --step"
            raise TraceError(f"{where}: no step {step} ({hint})")
        lo, hi = int(chosen["start"].min()), int(chosen["work_end"].max())
        return lo, lo, hi
    lo, hi = int(seg["start"].min()), int(seg["end"].max())
    starts = cpu.loc[cpu["category"] == "step", "start"]
    origin = int(starts.min()) if len(starts) else lo
    return origin, min(lo, origin), max(hi, lo + 1)


def _lane_keys(seg: pd.DataFrame) -> np.ndarray:
    rank, stream, group = (seg[c].to_numpy(dtype=np.int64) for c in ("rank", "stream_id", "group"))
    return (rank << 40) | ((stream + 1) << 8) | group


def _lanes(levels: list[pd.DataFrame]) -> pd.DataFrame:
    """Lane table (lane, label, rank, key) of the segments of `levels`: per rank its CPU lanes (stream_id -1)
    in group order, then per GPU stream its compute and comm lanes, then its overlap strip."""
    uniq = np.unique(np.concatenate([_lane_keys(seg) for seg in levels]))
    u_rank, u_stream, u_group = uniq >> 40, ((uniq >> 8) & 0xFFFFFFFF) - 1, uniq & 0xFF
    group_label = np.asarray(GROUP_LABELS, dtype=object)[u_group]
    gpu = (u_stream >= 0) & (u_group != STRIP)
    where = np.where(gpu, "GPU s" + u_stream.astype(str) + " " + group_label, group_label)
    labels = "r" + u_rank.astype(str) + " " + where
    return pd.DataFrame({"lane": np.arange(uniq.size), "label": labels, "rank": u_rank, "key": uniq})


@dataclass(frozen=True)
class Segments:
    """A run's drawable work, numbers only, for every panel of it: `cpu` its NVTX segments, `all` those and
    every rank's GPU work coloured by phase, `ranges` each rank's step and phase ranges, labelled.
    Built once per run by whoever draws it (a report draws each run twice: its timeline page and its
    side-by-side panel) and passed to each panel; shared, not to be modified."""

    cpu: pd.DataFrame
    all: pd.DataFrame
    ranges: RankRanges


def run_segments(run: LoadedRun) -> Segments:
    """The run's Segments, over the whole trace."""
    cpu = nvtx_segments(run.trace, run.patterns)
    seg = pd.concat([cpu, gpu_segments(run.trace)], ignore_index=True)
    seg = seg.loc[seg["rank"].to_numpy() >= 0]
    # a segment's colour depends on its own rank's phases alone
    return Segments(cpu, colour_by_phase(seg, cpu), rank_ranges(cpu))


def _in_view(
    run: LoadedRun, selection: Selection, segments: Segments
) -> tuple[pd.DataFrame, pd.DataFrame, list[RankWork], str]:
    """(cpu segments, all segments, rank work) of the selected ranks, and the trace's name for messages."""
    cpu, seg = segments.cpu, segments.all
    where = str(run.trace.path)
    if selection.rank is not None:
        if selection.rank not in set(seg["rank"].tolist()):
            raise TraceError(f"{where}: no rank {selection.rank} (ranks: {sorted(set(seg['rank'].tolist()))})")
        seg = seg.loc[seg["rank"].to_numpy() == selection.rank]
        cpu = cpu.loc[cpu["rank"].to_numpy() == selection.rank]
    if seg.empty:
        raise TraceError(f"{where}: no NVTX ranges or GPU work to draw")
    works = [w for w in run.works if selection.rank is None or w.rank == selection.rank]
    return cpu, seg, works, where


@dataclass(frozen=True)
class _View:
    """One level of detail: the window drawn and the communication its strip holds."""

    step: int | None
    lo: int
    hi: int


def _level(seg: pd.DataFrame, works: list[RankWork], view: _View) -> pd.DataFrame:
    """The segments of one view (coloured by phase already), strip included, not yet on lanes."""
    seg = seg.loc[(seg["end"].to_numpy() > view.lo) & (seg["start"].to_numpy() < view.hi)]
    strip = strip_segments(works, view.step, view.lo, view.hi)
    return pd.concat([seg, strip], ignore_index=True) if len(strip) else seg


def _merged(seg: pd.DataFrame, lanes: pd.DataFrame, pixel_ns: float) -> pd.DataFrame:
    """Segments on their lanes, sub-pixel work merged (not yet labelled)."""
    lane = np.searchsorted(lanes["key"].to_numpy(), _lane_keys(seg))
    return merge_subpixel(seg.assign(lane=lane), pixel_ns)


def _labelled(trace: Trace, ranges: RankRanges, merged: list[pd.DataFrame]) -> list[pd.DataFrame]:
    """Merged segments labelled (strings built only for what is drawn): each row's name, stream and phase
    depend on that row alone, so the frames of several views are labelled in one pass."""
    both = pd.concat(merged, ignore_index=True) if len(merged) > 1 else merged[0]
    names = names_of(trace, both)
    labels = {"name": names, "stream": streams_of(trace, both), "phase": phase_labels(ranges, both, names)}
    ends = np.cumsum([len(m) for m in merged])
    return [
        m.assign(**{k: v[end - len(m) : end] for k, v in labels.items()}) for m, end in zip(merged, ends, strict=True)
    ]


def build_panel(
    run: LoadedRun,
    selection: Selection = Selection(),
    title: str = "",
    width_px: int = 1600,
    opening_step: int | None = None,
    segments: Segments | None = None,
) -> Panel:
    """The panel for one run under a selection (title: the trace's path unless given); `segments`: the
    run's run_segments when the caller draws it more than once (else they are built here).

    Without a step selected and with `opening_step`, the panel shows that step and carries the whole
    run as its `overview` (same lanes, same time origin: the step's start), one click away.
    Work narrower than a pixel (window / width_px) is merged before any label string is built, so
    the cost of labels follows what is drawn, not the size of the trace.
    """
    segments = segments if segments is not None else run_segments(run)
    cpu, seg, works, where = _in_view(run, selection, segments)
    step = selection.step if selection.step is not None else opening_step
    views, origin = {}, 0
    if selection.step is None:
        origin, lo, hi = _window(cpu, seg, None, where, works)
        views["whole"] = _View(None, lo, hi)
    if step is not None:
        origin, s_lo, s_hi = _window(cpu, seg, step, where, works)
        views["step"] = _View(step, s_lo, s_hi)
    levels = {name: _level(seg, works, v) for name, v in views.items()}
    lanes = _lanes(list(levels.values()))
    merged = [_merged(levels[name], lanes, _pixel_ns(view, width_px)) for name, view in views.items()]
    placed = dict(zip(views, _labelled(run.trace, segments.ranges, merged), strict=True))
    panels = {
        name: _view_panel(title or where, levels[name], placed[name], lanes, origin, view, width_px)
        for name, view in views.items()
    }
    if "step" not in panels:
        return panels["whole"]
    whole = panels.get("whole")
    whole = None if whole is None else dataclasses.replace(whole, steps=_step_windows(works))
    return dataclasses.replace(panels["step"], overview=whole)


def build_step_panels(
    run: LoadedRun, chosen: Sequence[tuple[int, int, str]], width_px: int = 1600, segments: Segments | None = None
) -> list[Panel]:
    """build_panel(run, Selection(step=step, rank=rank), title) of each (step, rank, title), in one pass: each
    rank's segments and work are taken once, and what every view draws is labelled together."""
    segments = segments if segments is not None else run_segments(run)
    of_rank: dict[int, tuple[pd.DataFrame, pd.DataFrame, list[RankWork], str]] = {}
    views = []
    for step, rank, title in chosen:
        selection = Selection(step=step, rank=rank)
        if rank not in of_rank:
            of_rank[rank] = _in_view(run, selection, segments)
        cpu, seg, works, where = of_rank[rank]
        origin, lo, hi = _window(cpu, seg, step, where, works)
        view = _View(step, lo, hi)
        level = _level(seg, works, view)
        views.append((title or where, level, _lanes([level]), origin, view))
    merged = [_merged(level, lanes, _pixel_ns(view, width_px)) for _, level, lanes, _, view in views]
    placed = _labelled(run.trace, segments.ranges, merged)
    return [
        _view_panel(title, level, segs, lanes, origin, view, width_px)
        for (title, level, lanes, origin, view), segs in zip(views, placed, strict=True)
    ]


def _pixel_ns(view: _View, width_px: int) -> float:
    return (view.hi - view.lo) / width_px


def _view_panel(
    title: str, level: pd.DataFrame, placed: pd.DataFrame, lanes: pd.DataFrame, origin: int, view: _View, width_px: int
) -> Panel:
    """The Panel of one view: its labelled segments on `lanes`, and its strip's hidden periods (exact, from
    the level before merging)."""
    hidden = level.loc[level["category"] == HIDDEN]
    return Panel(
        title=title,
        segments=placed,
        lanes=lanes[["lane", "label", "rank"]],
        origin_ns=origin,
        window_ns=(view.lo, view.hi),
        overlap=pd.DataFrame({"rank": hidden["rank"], "start": hidden["start"], "end": hidden["end"]}),
        merged_pixel_ns=_pixel_ns(view, width_px),
    )


def _step_windows(works: list[RankWork]) -> tuple[tuple[int, int, int, str], ...]:
    """(step, start, end) of every numbered step over the drawn ranks: earliest start, latest end of its work."""
    frames = [w.windows[["step", "start", "work_end"]] for w in works]
    if not frames:
        return ()
    both = pd.concat(frames, ignore_index=True)
    both = both.loc[both["step"] >= 0].groupby("step").agg(start=("start", "min"), end=("work_end", "max"))
    return tuple((int(k), int(a), int(b), "") for k, a, b in zip(both.index, both["start"], both["end"], strict=True))
