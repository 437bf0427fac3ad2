"""Merge the results of one run's per-rank files (file_task.FileResult) into the run's analysis,
without its events: `combine(paths, results) -> Merged`.

`combine` turns the per-file results into exactly what `analyze_run(load_run(group))` gives
for the whole group: ranks numbered across files the same way, rows in rank order, the run's
metadata and shared-GPU flags from every file's ddp.meta marks and target info (ranks of two files
may share a GPU), the summary over every rank-step. The collectives' wait/transfer split
(metrics.SPLIT_METRICS) pairs every rank's calls: the files' calls are shifted onto the first
file's clock and paired with the one-piece code (call_groups.pair and call_groups.exposure, through
collective_rows.split_rows: only the columns the split needs, op as a code shared by the files).
torch.profiler files merge the same way, on their baseTimeNanoseconds clocks. Files of different
runs are refused by the loader's own check (run_files.check_one_run, from each file's recorded identity),
and the files' clocks come from the loader's one rule (clocks.clock_shifts).
overlap/metrics.across_ranks adds the per-step view of the merged run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.collectives.collective_rows import SPLIT_CALL_COLUMNS, split_rows, with_comm_split
from analysis.measure import intervals as iv
from analysis.measure.call_groups import world_size
from analysis.measure.collective_calls import Calls
from analysis.measure.comm_recognition import comm_note, merged_evidence
from analysis.overlap.analyze import TRACE_KEYS, Analysis, trace_keys, trace_summary
from analysis.overlap.metrics import SPLIT_METRICS, across_ranks
from analysis.parallel.file_task import FileResult
from analysis.run.clocks import PartAlignment, PartClock, clock_alignment, clock_note
from analysis.run.run_files import check_one_run, file_identity
from analysis.trace.frames import KERNELS, RANGES, Trace
from analysis.trace.run_info import shared_gpu_ranks


@dataclass(frozen=True)
class Merged:
    """A group's analysis (as if loaded in one piece) and its per-step view across ranks."""

    analysis: Analysis
    across_ranks: pd.DataFrame


def _global_ranks(results: Sequence[FileResult], parts: Sequence[int]) -> pd.DataFrame:
    """part, pid, device, local rank -> rank across the files, numbered as `load_trace` numbers a merge:
    from `ddp.meta` when every rank has a distinct integer one, else by (device, file, pid)."""
    ranks = pd.concat([results[i].ranks.assign(part=i) for i in parts], ignore_index=True)
    ranks = ranks.sort_values(["device", "part", "pid"]).reset_index(drop=True)
    meta = ranks["meta_rank"].tolist()
    usable = all(isinstance(m, int) and not isinstance(m, bool) for m in meta) and len(set(meta)) == len(meta)
    return ranks.assign(global_rank=np.array(meta if usable else range(len(ranks)), dtype=np.int64))


def file_alignment(results: Sequence[FileResult]) -> list[PartAlignment]:
    """Per file: how far onto the first file's clock, and why, by the loader's one rule (clocks.py)."""
    return clock_alignment([PartClock(r.clock_offset, r.calls.frame if r.calls is not None else None) for r in results])


def _renumbered(frame: pd.DataFrame, part: int, ranks: pd.DataFrame) -> pd.DataFrame:
    """A per-rank frame of file `part` with its ranks renumbered across files (and a part column)."""
    mine = ranks[ranks["part"] == part]
    at = pd.Index(mine["rank"].to_numpy()).get_indexer(frame["rank"].to_numpy())  # a file's ranks are distinct
    if (at < 0).any():
        raise ValueError(f"file {part}: a row's rank is not in the file's rank table")
    return frame.assign(rank=mine["global_rank"].to_numpy(dtype=np.int64)[at], part=part)


def _keyed(frame: pd.DataFrame, keys: dict) -> pd.DataFrame:
    """The frame with its trace keys replaced by the group's, in front as `analyze_trace` puts them."""
    frame = frame.drop(columns=[k for k in TRACE_KEYS if k in frame]).reset_index(drop=True)
    for i, (k, v) in enumerate(keys.items()):
        frame.insert(i, k, v)
    return frame


def combine(paths: Sequence[str | Path], results: Sequence[FileResult]) -> Merged:
    """The per-file results of one run's files (in path order) as one merged analysis; a TraceError
    when the files are not one run's."""
    check_one_run(
        [file_identity(p, r.meta.values(), r.step_ranges, r.clock_offset) for p, r in zip(paths, results, strict=True)]
    )
    source = KERNELS if any(r.source == KERNELS for r in results) else RANGES
    kept = [i for i, r in enumerate(results) if r.source == source]  # a merge counts ranks with GPU work only
    ranks = _global_ranks(results, kept)
    run = _run_of(paths, results, source, ranks)
    shared = shared_gpu_ranks(run)  # ranks of different files can share a GPU
    keys = trace_keys(run)
    frames: dict[str, pd.DataFrame] = {}
    for f in fields(Analysis):
        if f.name == "summary":
            continue
        parts = [_renumbered(getattr(results[i].analysis, f.name), i, ranks) for i in kept]
        merged = pd.concat(parts, ignore_index=True).sort_values("rank", kind="stable")
        if "shared_gpu" in merged:
            merged["shared_gpu"] = merged["rank"].isin(shared).to_numpy()
        frames[f.name] = _keyed(merged, keys)
    alignment = file_alignment(results)
    shifts = [a.shift_ns for a in alignment]
    if len(results) > 1:  # one file's own split pairs all its ranks' calls already
        calls = _merged_calls(results, kept, ranks, shifts)
        rows = split_rows(calls, world_size(run.meta, len(run.ranks)))
        frames["steps"], frames["totals"] = with_comm_split(
            frames["steps"].drop(columns=SPLIT_METRICS), frames["totals"].drop(columns=SPLIT_METRICS), rows
        )
    spread = across_ranks(frames["steps"], {i: results[i].step_ranges for i in kept}, {i: shifts[i] for i in kept})
    frames = {name: frame.drop(columns="part") for name, frame in frames.items()}
    summary = trace_summary(run, frames["steps"])
    summary["comm_note"] = _run_comm_note([results[i] for i in kept], world_size(run.meta, len(run.ranks)))
    ranks_of_part = {int(p): sorted(g["global_rank"].tolist()) for p, g in ranks.groupby("part")}
    summary["clock_note"] = clock_note(alignment, ranks_of_part)
    summary["phases"] = run_phases(
        [results[i].analysis.summary for i in kept], [ranks_of_part.get(i, []) for i in kept]
    )
    return Merged(Analysis(**frames, summary=summary), spread)


def _run_comm_note(results: Sequence[FileResult], world: int) -> str:
    """The run's "no communication recognised" note, written from its files' evidence merged exactly as
    a one-piece load writes it from the whole run (comm_recognition.comm_note)."""
    if any(r.comm is None for r in results):
        raise ValueError("combine needs each file's communication evidence (FileResult.comm)")
    return comm_note(merged_evidence([r.comm for r in results if r.comm is not None]), world)


def run_phases(summaries: Sequence[pd.DataFrame], ranks: Sequence[list[int]]) -> str:
    """Where the files' phases came from: their one sentence when they agree, else each file's with its ranks."""
    said: dict[str, list[int]] = {}
    for summary, mine in zip(summaries, ranks, strict=True):
        words = str(summary["phases"].iloc[0]) if "phases" in summary and len(summary) else ""
        said.setdefault(words, []).extend(mine)
    if len(said) == 1:
        return next(iter(said))
    return "; ".join(f"rank {', '.join(map(str, sorted(r)))}: {words}" for words, r in said.items())


def _merged_calls(
    results: Sequence[FileResult], kept: Sequence[int], ranks: pd.DataFrame, shifts: Sequence[int]
) -> Calls:
    """Every kept file's calls and compute as `find_calls` finds them in the one-piece load: ranks
    numbered across files, times shifted onto the first file's clock, kernel calls only when any file
    has them (a one-piece load takes the kernel source for the whole run when any rank has them).
    Only the columns the pairing reads (SPLIT_CALL_COLUMNS), `op` as a code shared by the files (an
    integer per op name) instead of the text."""
    kept_calls = {i: c for i in kept if (c := results[i].calls) is not None}
    if len(kept_calls) < len(kept):
        raise ValueError("combine needs each file's collective calls (FileResult.calls)")
    source = KERNELS if any(c.source == KERNELS for c in kept_calls.values()) else RANGES
    frames, compute = [], {}
    for i in kept:
        calls = kept_calls[i]
        shift = shifts[i]
        if calls.source == source:
            frame = _renumbered(calls.frame[SPLIT_CALL_COLUMNS], i, ranks)
            times = [c for c in ("issue_ns", "start_ns", "end_ns") if c in frame]
            frames.append(frame.assign(**{c: frame[c] + shift for c in times}))
        mine = ranks[ranks["part"] == i]
        for local, rank in zip(mine["rank"], mine["global_rank"], strict=True):  # one iteration per rank
            s, e = calls.compute.get(int(local), (iv.EMPTY, iv.EMPTY))
            compute[int(rank)] = (s + shift, e + shift)
    frame = pd.concat(frames, ignore_index=True).assign(op=np.concatenate(_op_codes([f["op"] for f in frames])))
    frame = frame.sort_values(["rank", "start_ns"], kind="stable").reset_index(drop=True)
    return Calls(frame, source, compute)


def _op_codes(ops: Sequence[pd.Series]) -> list[np.ndarray]:
    """Each file's op column as integer codes of one table of op names across the files (-1: none)."""
    cats = [op.astype("category").cat for op in ops]
    names = pd.Index(pd.unique(np.concatenate([c.categories.to_numpy(dtype=object) for c in cats])))
    return [np.where(c.codes >= 0, names.get_indexer(c.categories)[c.codes], -1) for c in cats]


def _run_of(paths: Sequence[str | Path], results: Sequence[FileResult], source: str, ranks: pd.DataFrame) -> Trace:
    """The merged run as a Trace without events: its keys, ranks (numbered across files), every file's
    ddp.meta marks and target info, as `load_trace` would give them; enough for run_info."""
    implementation = next(
        (r.implementation for r in results if r.implementation), results[0].name or Path(paths[0]).stem
    )
    ranks = (
        ranks.assign(rank=ranks["global_rank"], implementation=implementation)[
            ["rank", "part", "pid", "device", "implementation"]
        ]
        .sort_values("rank")
        .reset_index(drop=True)
    )
    return Trace(
        path=", ".join(str(p) for p in paths),
        profiler=results[0].profiler,
        profiler_version=results[0].profiler_version,
        source=source,
        gpu_ops=pd.DataFrame(),
        nvtx=pd.DataFrame(),
        ranks=ranks,
        meta={(i, pid): m for i, r in enumerate(results) for pid, m in r.meta.items()},
        implementation=implementation,
        info={i: r.info for i, r in enumerate(results)},
    )
