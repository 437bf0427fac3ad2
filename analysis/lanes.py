"""From a loaded trace to a timeline panel: lanes per rank, segments, overlap periods.

Lanes of each rank, top to bottom: CPU `step N` ranges, CPU phases (forward/backward/optimizer/
grad_sync), CPU communication ranges (`comm:*`, NCCL/gloo ranges; async ones from issue to
completion, whichever thread ends them), other NVTX ranges, then per GPU stream a compute lane and
a communication lane. Shaded overlap: GPU communication kernels under compute kernels when the
rank has GPU work, else CPU communication ranges under forward/backward/optimizer.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from analysis import intervals
from analysis.errors import TraceError
from analysis.patterns import META_PREFIX, Patterns, matches
from analysis.render_figure import Panel
from analysis.render_style import PHASE_CATEGORIES

# Lane groups in top-to-bottom order within a rank.
LANE_GROUPS = {"step": 0, "phases": 1, "comm": 2, "nvtx": 3, "gpu compute": 4, "gpu comm": 5}
NVTX_GROUP = {"step": "step", "comm": "comm", "nvtx": "nvtx", **{p: "phases" for p in PHASE_CATEGORIES}}
COMPUTE_PHASES = ("forward", "backward", "optimizer")
SKIPPED_RANGES = ("profile",)  # the capture range spans everything and says nothing


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


@dataclass(frozen=True)
class ViewFigures:
    """Overlap in the drawn window, averaged over the drawn ranks (ns)."""

    ranks: int
    comm_ns: float
    overlap_ns: float

    @property
    def exposed_ns(self) -> float:
        return self.comm_ns - self.overlap_ns

    @property
    def overlap_pct(self) -> float:
        return 100.0 * self.overlap_ns / self.comm_ns if self.comm_ns > 0 else 0.0


def classify_nvtx(text: pd.Series, patterns: Patterns) -> tuple[np.ndarray, np.ndarray]:
    """Category of each NVTX text and its step number (-1 if none), regexes run once per distinct text."""
    uniq, inverse = np.unique(text.astype(str).to_numpy(), return_inverse=True)
    names = pd.Series(uniq, dtype=object)
    category = np.full(uniq.size, "nvtx", dtype=object)
    for cat, field in (("comm", "comm_range"), ("optimizer", "optimizer"), ("forward", "forward"),
                       ("backward", "backward"), ("step", "step")):
        category[matches(names, patterns.regex(field))] = cat
    category[(names == "grad_sync").to_numpy()] = "grad_sync"
    number = names.str.extract(patterns.regex("step"), expand=True)
    steps = np.full(uniq.size, -1, dtype=np.int64)
    if number.shape[1] and category.size:
        is_step = (category == "step") & number[0].notna().to_numpy()
        steps[is_step] = number[0][is_step].astype(np.int64).to_numpy()
    return category[inverse], steps[inverse]


def _rank_of(keys: pd.DataFrame, ranks: pd.DataFrame, on: list[str]) -> np.ndarray:
    """Rank of each row of `keys` by the columns `on` (-1 where the process is no rank)."""
    table = ranks.drop_duplicates(on)[on + ["rank"]]
    return keys[on].merge(table, on=on, how="left")["rank"].fillna(-1).astype(np.int64).to_numpy()


def nvtx_segments(trace, patterns: Patterns) -> pd.DataFrame:
    """CPU segments: every NVTX range (marks and the capture range dropped) with rank and category."""
    nv = trace.nvtx
    nv = nv.loc[(nv["kind"] != "mark") & ~nv["text"].isin(SKIPPED_RANGES)
                & ~nv["text"].astype(str).str.startswith(META_PREFIX)]
    category, step = classify_nvtx(nv["text"], patterns)
    tid, end_tid = nv["tid"].to_numpy(), nv["end_tid"].to_numpy()
    thread = np.where(tid == end_tid, "tid " + tid.astype(str), "tid " + tid.astype(str) + " → " + end_tid.astype(str))
    return pd.DataFrame({
        "rank": _rank_of(nv, trace.ranks, ["part", "pid"]), "start": nv["start"].to_numpy(),
        "end": nv["end"].to_numpy(), "category": category, "step": step,
        "name": nv["text"].astype(str).to_numpy(), "stream": thread,
        "group": pd.Series(category).map(NVTX_GROUP).to_numpy(), "stream_id": -1,
        "when": nv["start"].to_numpy(),
    })


def gpu_segments(trace) -> pd.DataFrame:
    """GPU segments: kernels, copies and sets with rank, category and a launch time for phase lookup."""
    ops = trace.gpu_ops
    is_comm = ops["is_comm"].to_numpy(dtype=bool)
    memory = (ops["kind"] != "kernel").to_numpy()
    stream = ops["stream"].to_numpy()
    launch = ops["launch_start"].to_numpy()
    return pd.DataFrame({
        "rank": _rank_of(ops, trace.ranks, ["part", "pid", "device"]), "start": ops["start"].to_numpy(),
        "end": ops["end"].to_numpy(),
        "category": np.select([is_comm, memory], ["comm_kernel", "memory"], "compute"),
        "step": -1, "name": ops["name"].astype(str).to_numpy(),
        "stream": "stream " + stream.astype(str), "group": np.where(is_comm, "gpu comm", "gpu compute"),
        "stream_id": stream, "when": np.where(launch >= 0, launch, ops["start"].to_numpy()),
    })


def _phase_labels(cpu: pd.DataFrame, seg: pd.DataFrame) -> np.ndarray:
    """'step N · phase' around each segment's start (launch time for GPU work), per rank."""
    when = seg["when"].to_numpy()
    step_label = np.full(len(seg), "", dtype=object)
    phase_label = np.full(len(seg), "", dtype=object)
    for rank in np.unique(seg["rank"].to_numpy()):  # one pass per rank, vectorised inside
        mine = seg["rank"].to_numpy() == rank
        for kinds, out, label in ((["step"], step_label, lambda r: "step " + r["step"].astype(str)),
                                  (list(PHASE_CATEGORIES), phase_label, lambda r: r["category"])):
            ranges = cpu.loc[(cpu["rank"] == rank) & cpu["category"].isin(kinds)].sort_values("start")
            if ranges.empty:
                continue
            s, e = ranges["start"].to_numpy(), ranges["end"].to_numpy()
            i = np.searchsorted(s, when[mine], side="right") - 1
            inside = (i >= 0) & (when[mine] < e[np.maximum(i, 0)])
            names = label(ranges).to_numpy().astype(object)
            out[mine] = np.where(inside, names[np.maximum(i, 0)], "")
    joined = pd.Series(step_label) + np.where((step_label != "") & (phase_label != ""), " · ", "") + phase_label
    own = seg["group"].isin(["step", "phases"]).to_numpy()
    return np.where(own, seg["name"].to_numpy(), joined.replace("", "—").to_numpy())


def _window(cpu: pd.DataFrame, seg: pd.DataFrame, step: int | None, where: str) -> tuple[int, int, int]:
    """(origin, window start, window end) in ns: the chosen step's span, or the whole selection."""
    steps = cpu.loc[cpu["category"] == "step"]
    if step is not None:
        chosen = steps.loc[steps["step"] == step]
        if chosen.empty:
            have = sorted(set(steps["step"].tolist()))
            hint = f"steps present: {have[0]}..{have[-1]}" if have else "it has no `step N` ranges; omit --step"
            raise TraceError(f"{where}: no step {step} ({hint})")
        lo, hi = int(chosen["start"].min()), int(chosen["end"].max())
        return lo, lo, hi
    lo, hi = int(seg["start"].min()), int(seg["end"].max())
    origin = int(steps["start"].min()) if len(steps) else lo
    return origin, min(lo, origin), max(hi, lo + 1)


def _lanes(seg: pd.DataFrame) -> tuple[pd.DataFrame, np.ndarray]:
    """Lane table (lane, label, rank) and each segment's lane, ordered rank, group, stream."""
    keys = seg[["rank", "group", "stream_id"]].drop_duplicates()
    # CPU lanes (stream_id -1) first in group order, then per GPU stream its compute and comm lanes.
    keys = keys.assign(order=keys["group"].map(LANE_GROUPS)).sort_values(["rank", "stream_id", "order"])
    keys = keys.reset_index(drop=True)
    gpu = keys["stream_id"] >= 0
    where = np.where(gpu, "GPU s" + keys["stream_id"].astype(str) + " " + keys["group"].str.slice(4),
                     "CPU " + keys["group"].replace({"nvtx": "other NVTX"}))
    lanes = pd.DataFrame({"lane": np.arange(len(keys)), "label": "r" + keys["rank"].astype(str) + " " + where,
                          "rank": keys["rank"].to_numpy()})
    lane_of = seg[["rank", "group", "stream_id"]].merge(keys.assign(lane=lanes["lane"]), how="left")["lane"]
    return lanes, lane_of.to_numpy()


def _overlap(seg: pd.DataFrame, lo: int, hi: int) -> tuple[pd.DataFrame, ViewFigures]:
    """Per rank: periods where communication runs under compute, clipped to the window."""
    rows, comm_total, overlap_total = [], 0, 0
    ranks = np.unique(seg["rank"].to_numpy())
    for rank in ranks:  # one pass per rank
        mine = seg.loc[seg["rank"] == rank]
        on_gpu = (mine["stream_id"] >= 0).any()
        if on_gpu:
            comm = mine.loc[mine["category"] == "comm_kernel"]
            compute = mine.loc[mine["category"] == "compute"]
        else:
            comm = mine.loc[mine["category"] == "comm"]
            compute = mine.loc[mine["category"].isin(COMPUTE_PHASES)]
        cs, ce = intervals.union(*intervals.clip(comm["start"], comm["end"], lo, hi))
        ks, ke = intervals.clip(compute["start"], compute["end"], lo, hi)
        os_, oe = intervals.intersect(cs, ce, ks, ke)
        comm_total += intervals.total_length(cs, ce)
        overlap_total += intervals.total_length(os_, oe)
        rows.append(pd.DataFrame({"rank": rank, "start": os_, "end": oe}))
    n = max(len(ranks), 1)
    shaded = pd.concat(rows, ignore_index=True) if rows else pd.DataFrame(columns=["rank", "start", "end"])
    return shaded, ViewFigures(len(ranks), comm_total / n, overlap_total / n)


def build_panel(trace, selection: Selection = Selection(), patterns: Patterns = Patterns(),
                title: str = "") -> tuple[Panel, ViewFigures]:
    """The panel for one trace under a selection, and the overlap figures of what it shows."""
    cpu = nvtx_segments(trace, patterns)
    seg = pd.concat([cpu, gpu_segments(trace)], ignore_index=True)
    seg = seg.loc[seg["rank"] >= 0]
    where = str(trace.path)
    if selection.rank is not None:
        if selection.rank not in set(seg["rank"].tolist()):
            raise TraceError(f"{where}: no rank {selection.rank} (ranks: {sorted(set(seg['rank'].tolist()))})")
        seg = seg.loc[seg["rank"] == selection.rank]
        cpu = cpu.loc[cpu["rank"] == selection.rank]
    if seg.empty:
        raise TraceError(f"{where}: no NVTX ranges or GPU work to draw")
    origin, lo, hi = _window(cpu, seg, selection.step, where)
    seg = seg.loc[(seg["end"] > lo) & (seg["start"] < hi)].reset_index(drop=True)
    seg["phase"] = _phase_labels(cpu, seg)
    lanes, seg["lane"] = _lanes(seg)
    shaded, figures = _overlap(seg, lo, hi)
    panel = Panel(title=title or where, segments=seg, lanes=lanes, origin_ns=origin, window_ns=(lo, hi),
                  overlap=shaded)
    return panel, figures
