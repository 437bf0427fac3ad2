"""From a loaded trace to a timeline panel: lanes per rank, segments, overlap periods.

Lanes of each rank, top to bottom: CPU `step N` ranges, CPU phases (forward/backward/optimizer/
grad_sync), CPU communication ranges (`comm:*`, NCCL/gloo ranges; async ones from issue to
completion, whichever thread ends them), other NVTX ranges, then per GPU stream a compute lane and
a communication lane. Shaded overlap is the analysis' own (measures/activity.py: rank_work, overlap_periods): the rank's
communication (GPU kernels and copies; comm ranges where collectives run on the host; CPU-only
ranks: comm ranges) under its compute (GPU kernels; CPU-only ranks: forward/backward/optimizer minus
blocking comm and gradient-sync waits). A step view spans the GPU-aware step (analysis.measures.steps) and
everything launched in it, and shades the communication launched in that step, so its shading
equals that step's overlap_ms; the all-steps view shades all communication under all compute.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike

from analysis.errors import TraceError
from analysis.frames.patterns import Patterns, matches
from analysis.frames.trace import Trace
from analysis.measures.activity import overlap_periods, rank_work
from analysis.views.render_binning import merge_subpixel
from analysis.views.render_figure import Panel
from analysis.views.render_style import CATEGORY_COLOURS, PHASE_CATEGORIES
from contract import BACKWARD, FORWARD, GRAD_SYNC, OPTIMIZER, PROFILE

# Lane groups in top-to-bottom order within a rank (GPU groups repeat per stream).
GROUP_LABELS = ("CPU step", "CPU phases", "CPU comm", "CPU other NVTX", "compute", "comm")
STEP, PHASES, COMM, NVTX, GPU_COMPUTE, GPU_COMM = range(len(GROUP_LABELS))
NVTX_GROUP = {"step": STEP, "comm": COMM, "nvtx": NVTX, **dict.fromkeys(PHASE_CATEGORIES, PHASES)}
CATEGORIES = list(CATEGORY_COLOURS)
COMPUTE_PHASES = (FORWARD, BACKWARD, OPTIMIZER)
SKIPPED_RANGES = (PROFILE,)  # the capture range spans everything and says nothing
FROM_NVTX, FROM_GPU = 0, 1


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


def classify_nvtx(text: pd.Series, patterns: Patterns) -> tuple[np.ndarray, np.ndarray]:
    """Category of each NVTX text and its step number (-1 if none), regexes run once per distinct text."""
    uniq, inverse = np.unique(text.astype(str).to_numpy(), return_inverse=True)
    names = pd.Series(uniq, dtype=object)
    category = np.full(uniq.size, "nvtx", dtype=object)
    for cat, field in (
        ("comm", "comm_range"),
        (OPTIMIZER, "optimizer"),
        (FORWARD, "forward"),
        (BACKWARD, "backward"),
        ("step", "step"),
    ):
        category[matches(names, patterns.regex(field))] = cat
    category[matches(names, patterns.regex("sync_wait"))] = GRAD_SYNC  # waits for gradient sync
    number = names.str.extract(patterns.regex("step"), expand=True)
    steps = np.full(uniq.size, -1, dtype=np.int64)
    if number.shape[1] and category.size:
        is_step = (category == "step") & number[0].notna().to_numpy()
        steps[is_step] = number[0][is_step].astype(np.int64).to_numpy()
    return category[inverse], steps[inverse]


def _process_key(part: ArrayLike, pid: ArrayLike, device: ArrayLike | None = None) -> np.ndarray:
    """One int64 per (file part, process[, device]) for vectorised rank lookup."""
    key = (np.asarray(part, dtype=np.int64) << 40) | (np.asarray(pid, dtype=np.int64) << 16)
    return key if device is None else key | ((np.asarray(device, dtype=np.int64) + 1) & 0xFFFF)


def _rank_of(keys: np.ndarray, table_keys: np.ndarray, table_ranks: np.ndarray) -> np.ndarray:
    """Rank of each key (-1 where the process/device is no rank), by binary search."""
    order = np.argsort(table_keys, kind="stable")
    sorted_keys, ranks = table_keys[order], table_ranks[order]
    if sorted_keys.size == 0:
        return np.full(keys.shape, -1, dtype=np.int64)
    i = np.minimum(np.searchsorted(sorted_keys, keys), sorted_keys.size - 1)
    return np.where(sorted_keys[i] == keys, ranks[i], -1)


def nvtx_segments(trace: Trace, patterns: Patterns) -> pd.DataFrame:
    """CPU segments (numbers only): NVTX ranges, marks and the capture range dropped."""
    nv = trace.nvtx
    keep = ((nv["kind"] != "mark") & ~nv["text"].isin(SKIPPED_RANGES)).to_numpy()
    rows = np.flatnonzero(keep)
    nv = nv.iloc[rows]
    category, step = classify_nvtx(nv["text"], patterns)
    first = trace.ranks.drop_duplicates(["part", "pid"])
    rank = _rank_of(
        _process_key(nv["part"], nv["pid"]), _process_key(first["part"], first["pid"]), first["rank"].to_numpy()
    )
    return pd.DataFrame(
        {
            "rank": rank,
            "start": nv["start"].to_numpy(),
            "end": nv["end"].to_numpy(),
            "category": pd.Categorical(category, categories=CATEGORIES),
            "step": step,
            "group": pd.Series(category).map(NVTX_GROUP).to_numpy(dtype=np.int64),
            "stream_id": -1,
            "when": nv["start"].to_numpy(),
            "src": FROM_NVTX,
            "row": rows,
            "blocking": (nv["kind"] == "push_pop").to_numpy(),  # a blocking (push/pop) range, not async
        }
    )


def gpu_segments(trace: Trace) -> pd.DataFrame:
    """GPU segments (numbers only): kernels, copies and sets with a launch time for phase lookup."""
    ops, ranks = trace.gpu_ops, trace.ranks
    is_comm = ops["is_comm"].to_numpy(dtype=bool)
    memory = (ops["kind"] != "kernel").to_numpy()
    launch, start = ops["launch_start"].to_numpy(), ops["start"].to_numpy()
    codes = np.select(
        [is_comm, memory], [CATEGORIES.index("comm_kernel"), CATEGORIES.index("memory")], CATEGORIES.index("compute")
    )
    return pd.DataFrame(
        {
            "rank": _rank_of(
                _process_key(ops["part"], ops["pid"], ops["device"]),
                _process_key(ranks["part"], ranks["pid"], ranks["device"]),
                ranks["rank"].to_numpy(),
            ),
            "start": start,
            "end": ops["end"].to_numpy(),
            "category": pd.Categorical.from_codes(codes, categories=CATEGORIES),
            "step": -1,
            "group": np.where(is_comm, GPU_COMM, GPU_COMPUTE),
            "stream_id": ops["stream"].to_numpy(),
            "when": np.where(launch >= 0, launch, start),
            "src": FROM_GPU,
            "row": np.arange(len(ops)),
            "blocking": False,
        }
    )


def _names(trace: Trace, seg: pd.DataFrame) -> np.ndarray:
    """Name of each (merged) segment's first member: NVTX text or kernel/copy name."""
    src, row = seg["src"].to_numpy(), seg["row"].to_numpy()
    out = np.empty(len(seg), dtype=object)
    nvtx = src == FROM_NVTX
    out[nvtx] = trace.nvtx["text"].to_numpy()[row[nvtx]]
    names = trace.gpu_ops["name"]
    if isinstance(names.dtype, pd.CategoricalDtype):  # index the few categories, not a 1M-row copy
        out[~nvtx] = names.cat.categories.to_numpy()[names.cat.codes.to_numpy()[row[~nvtx]]]
    else:
        out[~nvtx] = names.to_numpy()[row[~nvtx]]
    return out


def _streams(trace: Trace, seg: pd.DataFrame) -> np.ndarray:
    """'stream S' for GPU work; 'tid T' (or 'tid T → U' for ranges ended on another thread) for NVTX."""
    nvtx = seg["src"].to_numpy() == FROM_NVTX
    rows = seg["row"].to_numpy()[nvtx]
    tid = trace.nvtx["tid"].to_numpy()[rows].astype(str)
    end_tid = trace.nvtx["end_tid"].to_numpy()[rows].astype(str)
    out = ("stream " + seg["stream_id"].astype(str)).to_numpy(dtype=object)
    out[nvtx] = np.where(tid == end_tid, "tid " + tid, "tid " + tid + " → " + end_tid)
    return out


def _phase_labels(cpu: pd.DataFrame, seg: pd.DataFrame, names: np.ndarray) -> np.ndarray:
    """'step N · phase' around each segment's start (launch time for GPU work), per rank."""
    when = seg["when"].to_numpy()
    step_label = np.full(len(seg), "", dtype=object)
    phase_label = np.full(len(seg), "", dtype=object)
    for rank in np.unique(seg["rank"].to_numpy()):  # one pass per rank, vectorised inside
        mine = seg["rank"].to_numpy() == rank
        for kinds, out, label in (
            (["step"], step_label, lambda r: "step " + r["step"].astype(str)),
            (list(PHASE_CATEGORIES), phase_label, lambda r: r["category"].astype(str)),
        ):
            ranges = cpu.loc[(cpu["rank"] == rank) & cpu["category"].isin(kinds)].sort_values("start")
            if ranges.empty:
                continue
            s, e = ranges["start"].to_numpy(), ranges["end"].to_numpy()
            i = np.searchsorted(s, when[mine], side="right") - 1
            inside = (i >= 0) & (when[mine] < e[np.maximum(i, 0)])
            labels = label(ranges).to_numpy().astype(object)
            out[mine] = np.where(inside, labels[np.maximum(i, 0)], "")
    joined = pd.Series(step_label) + np.where((step_label != "") & (phase_label != ""), " · ", "") + phase_label
    own = np.isin(seg["group"].to_numpy(), [STEP, PHASES])
    return np.where(own, names, joined.replace("", "—").to_numpy())


def _window(cpu: pd.DataFrame, seg: pd.DataFrame, step: int | None, where: str, works: list) -> tuple[int, int, int]:
    """(origin, window start, window end) in ns: the chosen step (from its start to the later of its
    window end and the end of the work launched in it, over the drawn ranks), or the whole selection."""
    steps = cpu.loc[cpu["category"] == "step"]
    if step is not None:
        chosen = [w.windows.loc[w.windows["step"] == step] for w in works]
        chosen = pd.concat(chosen) if chosen else pd.DataFrame(columns=["start", "work_end"])
        if chosen.empty:
            have = sorted(set(steps["step"].tolist()))
            hint = f"steps present: {have[0]}..{have[-1]}" if have else "it has no `step N` ranges; omit --step"
            raise TraceError(f"{where}: no step {step} ({hint})")
        lo, hi = int(chosen["start"].min()), int(chosen["work_end"].max())
        return lo, lo, hi
    lo, hi = int(seg["start"].min()), int(seg["end"].max())
    origin = int(steps["start"].min()) if len(steps) else lo
    return origin, min(lo, origin), max(hi, lo + 1)


def _lanes(seg: pd.DataFrame) -> tuple[pd.DataFrame, np.ndarray]:
    """Lane table (lane, label, rank) and each segment's lane.

    Per rank: CPU lanes (stream_id -1) in group order, then per GPU stream its compute and comm lanes.
    """
    rank, stream, group = (seg[c].to_numpy(dtype=np.int64) for c in ("rank", "stream_id", "group"))
    key = (rank << 40) | ((stream + 1) << 8) | group
    uniq, lane_of = np.unique(key, return_inverse=True)
    u_rank, u_stream, u_group = uniq >> 40, ((uniq >> 8) & 0xFFFFFFFF) - 1, uniq & 0xFF
    group_label = np.asarray(GROUP_LABELS, dtype=object)[u_group]
    where = np.where(u_stream >= 0, "GPU s" + u_stream.astype(str) + " " + group_label, group_label)
    labels = "r" + u_rank.astype(str) + " " + where
    return pd.DataFrame({"lane": np.arange(uniq.size), "label": labels, "rank": u_rank}), lane_of


def _overlap(works: list, step: int | None, lo: int, hi: int) -> pd.DataFrame:
    """Per rank (rank, start, end): the analysis' overlap periods inside [lo, hi) (activity.overlap_periods)."""
    rows = []
    for w in works:  # one pass per rank
        os_, oe = overlap_periods(w, step, lo, hi)
        rows.append(pd.DataFrame({"rank": np.full(len(os_), w.rank, dtype=np.int64), "start": os_, "end": oe}))
    return pd.concat(rows, ignore_index=True) if rows else pd.DataFrame(columns=["rank", "start", "end"])


def build_panel(
    trace: Trace,
    selection: Selection = Selection(),
    patterns: Patterns | None = None,
    title: str = "",
    width_px: int = 1600,
) -> Panel:
    """The panel for one trace under a selection (title: the trace's path unless given).

    Work narrower than a pixel (window / width_px) is merged before any label string is built, so
    the cost of labels follows what is drawn, not the size of the trace.
    """
    patterns = patterns or Patterns()
    cpu = nvtx_segments(trace, patterns)
    seg = pd.concat([cpu, gpu_segments(trace)], ignore_index=True)
    seg = seg.loc[seg["rank"].to_numpy() >= 0]
    where = str(trace.path)
    if selection.rank is not None:
        if selection.rank not in set(seg["rank"].tolist()):
            raise TraceError(f"{where}: no rank {selection.rank} (ranks: {sorted(set(seg['rank'].tolist()))})")
        seg = seg.loc[seg["rank"].to_numpy() == selection.rank]
        cpu = cpu.loc[cpu["rank"].to_numpy() == selection.rank]
    if seg.empty:
        raise TraceError(f"{where}: no NVTX ranges or GPU work to draw")
    works = [w for w in rank_work(trace, patterns) if selection.rank is None or w.rank == selection.rank]
    origin, lo, hi = _window(cpu, seg, selection.step, where, works)
    seg = seg.loc[(seg["end"].to_numpy() > lo) & (seg["start"].to_numpy() < hi)].reset_index(drop=True)
    lanes, lane_of = _lanes(seg)
    seg["lane"] = lane_of
    shaded = _overlap(works, selection.step, lo, hi)
    pixel_ns = (hi - lo) / width_px
    seg = merge_subpixel(seg, pixel_ns)
    names = _names(trace, seg)
    seg = seg.assign(name=names, stream=_streams(trace, seg), phase=_phase_labels(cpu, seg, names))
    panel = Panel(
        title=title or where,
        segments=seg,
        lanes=lanes,
        origin_ns=origin,
        window_ns=(lo, hi),
        overlap=shaded,
        merged_pixel_ns=pixel_ns,
    )
    return panel
