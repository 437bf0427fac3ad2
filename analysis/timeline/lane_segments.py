"""The segments a timeline draws, as numbers: NVTX ranges, GPU work and the overlap strip of each rank,
each with its rank, category (colour), lane group and the rows it came from; then, for what is
drawn, the strings of its hover (name, stream or thread, step and phase).

Categories: CPU ranges by kind (step, phases, comm ranges by collective, other NVTX); GPU compute
by the phase its launch fell in (forward/backward/optimizer, else "compute"), GPU communication by
collective, copies and sets as memory; the strip's hidden and exposed communication.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike

from analysis.measure.activity import RankWork
from analysis.measure.rank_periods import exposed_periods, overlap_periods
from analysis.timeline.style import (
    CATEGORY_COLOURS,
    CATEGORY_LABELS,
    COMM_CATEGORIES,
    EXPOSED,
    HIDDEN,
    PHASE_CATEGORIES,
    comm_category,
)
from analysis.trace.frames import Trace
from analysis.trace.patterns import Patterns, matches
from contract import BACKWARD, FORWARD, GRAD_SYNC, OPTIMIZER, PROFILE

# Lane groups in top-to-bottom order within a rank (GPU groups repeat per stream; the strip comes last).
GROUP_LABELS = ("CPU step", "CPU phases", "CPU comm", "CPU other NVTX", "compute", "comm", "overlap")
STEP, PHASES, COMM, NVTX, GPU_COMPUTE, GPU_COMM, STRIP = range(len(GROUP_LABELS))
NVTX_GROUP = {
    "step": STEP,
    "nvtx": NVTX,
    **dict.fromkeys(PHASE_CATEGORIES, PHASES),
    **dict.fromkeys(COMM_CATEGORIES, COMM),
}
CATEGORIES = list(CATEGORY_COLOURS)
COMPUTE_PHASES = (FORWARD, BACKWARD, OPTIMIZER)
SKIPPED_RANGES = (PROFILE,)  # the capture range spans everything and says nothing
FROM_NVTX, FROM_GPU, FROM_STRIP = 0, 1, 2
STRIP_STREAM = 0xFFFFFFFE  # sorts the strip after every GPU stream of its rank


def classify_nvtx(text: pd.Series, patterns: Patterns) -> tuple[np.ndarray, np.ndarray]:
    """Category of each NVTX text and its step number (-1 if none), regexes run once per distinct text."""
    uniq, inverse = np.unique(text.astype(str).to_numpy(), return_inverse=True)
    names = pd.Series(uniq, dtype=object)
    category = np.full(uniq.size, "nvtx", dtype=object)
    is_comm = matches(names, patterns.regex("comm_range"))
    category[is_comm] = [comm_category(n) for n in uniq[is_comm]]  # one per distinct comm range name
    for cat, field in ((OPTIMIZER, "optimizer"), (FORWARD, "forward"), (BACKWARD, "backward"), ("step", "step")):
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
    payload = nv["payload"].to_numpy(dtype=float) if "payload" in nv else np.full(len(nv), -1.0)
    is_comm = np.isin(category, COMM_CATEGORIES)
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
            "bytes": np.where(is_comm & (payload >= 0), payload, np.nan),  # a comm range's payload counts bytes
        }
    )


def _comm_categories(names: pd.Series, rows: np.ndarray) -> np.ndarray:
    """Comm category of the GPU ops at `rows`, worked out once per distinct name."""
    picked = names.iloc[rows].astype(str).to_numpy()
    uniq, inverse = np.unique(picked, return_inverse=True)
    return np.array([comm_category(n) for n in uniq] or ["comm:other"], dtype=object)[inverse]


def gpu_segments(trace: Trace) -> pd.DataFrame:
    """GPU segments (numbers only): kernels, copies and sets with a launch time for phase lookup.
    Compute is "compute" here; colour_by_phase gives it the phase that launched it."""
    ops, ranks = trace.gpu_ops, trace.ranks
    is_comm = ops["is_comm"].to_numpy(dtype=bool)
    memory = (ops["kind"] != "kernel").to_numpy()
    launch, start = ops["launch_start"].to_numpy(), ops["start"].to_numpy()
    codes = np.where(memory, CATEGORIES.index("memory"), CATEGORIES.index("compute"))
    comm_rows = np.flatnonzero(is_comm)
    codes[comm_rows] = [CATEGORIES.index(c) for c in _comm_categories(ops["name"], comm_rows)]
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
            "bytes": np.nan,
        }
    )


def _containing(ranges: pd.DataFrame, when: np.ndarray) -> np.ndarray:
    """Index into `ranges` (sorted by start, not overlapping) of the range holding each time, or -1."""
    s, e = ranges["start"].to_numpy(), ranges["end"].to_numpy()
    i = np.searchsorted(s, when, side="right") - 1
    inside = (i >= 0) & (when < e[np.maximum(i, 0)])
    return np.where(inside, i, -1)


def colour_by_phase(seg: pd.DataFrame, cpu: pd.DataFrame) -> pd.DataFrame:
    """GPU compute re-categorised by the CPU phase (forward/backward/optimizer) its launch fell in, per
    rank; compute launched outside them stays "compute". The input frame is not modified."""
    category = seg["category"].to_numpy(copy=True)
    is_compute = (seg["src"].to_numpy() == FROM_GPU) & (category == "compute")
    rank, when = seg["rank"].to_numpy(), seg["when"].to_numpy()
    phases = cpu.loc[cpu["category"].isin(COMPUTE_PHASES)]
    for r, ranges in phases.groupby("rank", sort=False):  # one pass per rank, vectorised inside
        mine = np.flatnonzero(is_compute & (rank == r))
        ranges = ranges.sort_values("start")
        i = _containing(ranges, when[mine])
        names = ranges["category"].astype(str).to_numpy()
        category[mine[i >= 0]] = names[i[i >= 0]]
    return seg.assign(category=pd.Categorical(category, categories=CATEGORIES))


def strip_segments(works: list[RankWork], step: int | None, lo: int, hi: int) -> pd.DataFrame:
    """Per rank its overlap strip: the communication launched in `step` (all when None) inside [lo, hi),
    hidden under its compute or exposed (rank_periods.overlap_periods / exposed_periods)."""
    ranks, starts, ends, codes = [], [], [], []
    for w in works:  # one pass per rank; one frame for all of them
        for category, (s, e) in (
            (HIDDEN, overlap_periods(w, step, lo, hi)),
            (EXPOSED, exposed_periods(w, step, lo, hi)),
        ):
            ranks.append(np.full(len(s), w.rank, dtype=np.int64))
            starts.append(np.asarray(s))
            ends.append(np.asarray(e))
            codes.append(np.full(len(s), CATEGORIES.index(category)))
    if not ranks:
        return pd.DataFrame()
    start = np.concatenate(starts)
    return pd.DataFrame(
        {
            "rank": np.concatenate(ranks),
            "start": start,
            "end": np.concatenate(ends),
            "category": pd.Categorical.from_codes(np.concatenate(codes), categories=CATEGORIES),
            "step": -1,
            "group": STRIP,
            "stream_id": STRIP_STREAM,
            "when": start,
            "src": FROM_STRIP,
            "row": -1,
            "bytes": np.nan,
        }
    )


def names_of(trace: Trace, seg: pd.DataFrame) -> np.ndarray:
    """Name of each (merged) segment's first member: NVTX text, kernel/copy name or the strip's label."""
    src, row = seg["src"].to_numpy(), seg["row"].to_numpy()
    out = seg["category"].astype(str).map(CATEGORY_LABELS).to_numpy(dtype=object)  # the strip's rows
    nvtx, gpu = src == FROM_NVTX, src == FROM_GPU
    out[nvtx] = trace.nvtx["text"].to_numpy()[row[nvtx]]
    names = trace.gpu_ops["name"]
    if isinstance(names.dtype, pd.CategoricalDtype):  # index the few categories, not a 1M-row copy
        out[gpu] = names.cat.categories.to_numpy()[names.cat.codes.to_numpy()[row[gpu]]]
    else:
        out[gpu] = names.to_numpy()[row[gpu]]
    return out


def streams_of(trace: Trace, seg: pd.DataFrame) -> np.ndarray:
    """'s S' for GPU work (its lane names the stream too); 'tid T' (or 'tid T → U' for ranges ended on
    another thread) for NVTX; 'rank R' for the strip."""
    src = seg["src"].to_numpy()
    nvtx = src == FROM_NVTX
    rows = seg["row"].to_numpy()[nvtx]
    tid = trace.nvtx["tid"].to_numpy()[rows].astype(str)
    end_tid = trace.nvtx["end_tid"].to_numpy()[rows].astype(str)
    out = ("s" + seg["stream_id"].astype(str)).to_numpy(dtype=object)
    out[nvtx] = np.where(tid == end_tid, "tid " + tid, "tid " + tid + " → " + end_tid)
    out[src == FROM_STRIP] = ("rank " + seg["rank"].astype(str)).to_numpy()[src == FROM_STRIP]
    return out


RankRanges = dict[int, tuple[tuple[pd.DataFrame, np.ndarray], ...]]


def rank_ranges(cpu: pd.DataFrame) -> RankRanges:
    """Per rank, its step ranges and its phase ranges (each sorted by start) with their labels ('step N',
    the phase): what phase_labels looks segments up in."""
    out: RankRanges = {}
    for rank, mine in cpu.groupby("rank", sort=False):  # one pass per rank
        found = []
        for kinds, label in (
            (["step"], lambda r: "step " + r["step"].astype(str)),
            (list(PHASE_CATEGORIES), lambda r: r["category"].astype(str)),
        ):
            ranges = mine.loc[mine["category"].isin(kinds)].sort_values("start", kind="stable")
            found.append((ranges, label(ranges).to_numpy().astype(object)))
        out[int(rank)] = tuple(found)
    return out


def phase_labels(ranges: RankRanges, seg: pd.DataFrame, names: np.ndarray) -> np.ndarray:
    """'step N · phase' around each segment's start (launch time for GPU work), per rank (`ranges`:
    rank_ranges of the CPU segments)."""
    when = seg["when"].to_numpy()
    step_label = np.full(len(seg), "", dtype=object)
    phase_label = np.full(len(seg), "", dtype=object)
    rank = seg["rank"].to_numpy()
    for r in np.unique(rank):  # one pass per rank, vectorised inside
        mine = rank == r
        for (found, labels), out in zip(ranges.get(int(r), ()), (step_label, phase_label), strict=True):
            if found.empty:
                continue
            i = _containing(found, when[mine])
            out[mine] = np.where(i >= 0, labels[np.maximum(i, 0)], "")
    joined = pd.Series(step_label) + np.where((step_label != "") & (phase_label != ""), " · ", "") + phase_label
    own = np.isin(seg["group"].to_numpy(), [STEP, PHASES])
    return np.where(own, names, joined.replace("", "—").to_numpy())
