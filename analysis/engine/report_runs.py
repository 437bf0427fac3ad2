"""The report's inputs analysed, hashed and ranked: what `python -m analysis.report` writes out.

Each input (a trace, or one run's per-rank files) is analysed file by file through
`groups.analyze_groups` (here, in --jobs processes or on a Dask cluster), every file with the
sha256 of its bytes, which keys the report's results.db rows; `summary_frame` ranks the inputs and
`steps_frame` lists their steps.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.engine.analyze import Analysis
from analysis.engine.file_task import FileResult, analyze_file
from analysis.engine.groups import analyze_groups, report_failures
from analysis.engine.parallel import Progress, check_jobs, default_jobs
from analysis.engine.runs import load_trace
from analysis.frames.patterns import Patterns
from analysis.frames.trace import Trace
from analysis.readers.load import TraceInput


@dataclass(frozen=True)
class AnalyzedTrace:
    """One input trace: its label (the path, or the rank files' pattern), content hash, trace, analysis."""

    path: str
    name: str
    sha256: str
    trace: Trace | None  # None: the analysis ran file by file and the timelines load the trace again
    analysis: Analysis
    paths: tuple = ()


def content_hash(path: Path) -> str:
    """sha256 of the file's bytes, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def group_sha256(hashes: list[str]) -> str:
    """A trace's hash: its file's, or for per-rank files the sha256 of their hashes joined."""
    return hashes[0] if len(hashes) == 1 else hashlib.sha256("".join(hashes).encode()).hexdigest()


def hashed_file(path: Path, patterns: Patterns | None = None) -> FileResult:
    """One file's analysis with its content hash (runs in worker processes: see engine/parallel.py)."""
    return replace(analyze_file(path, patterns), sha256=content_hash(path))


def analyze_all(
    inputs: list[TraceInput], jobs: int | None, dask: str | None, patterns: Patterns | None = None
) -> tuple[list[AnalyzedTrace], list[str]]:
    """Every file of every input analysed on its own (here, in --jobs processes or on --dask), per-rank
    files merged from their results; prints each bad file's error and returns (results, bad files)."""
    check_jobs(jobs)
    files = [p for inp in inputs for p in inp.paths]
    done = analyze_groups(
        [list(inp.paths) for inp in inputs],
        patterns,
        jobs=jobs or default_jobs(files),
        dask=dask,
        progress=Progress(len(files), "[report]"),
        task=partial(hashed_file, patterns=patterns),
    )
    bad = report_failures(done)
    results = [
        AnalyzedTrace(
            inp.label,
            inp.name,
            group_sha256([f.sha256 for f in g.files] or [content_hash(p) for p in inp.paths]),  # merged runs
            None,
            g.merged.analysis,
            inp.paths,
        )
        for inp, g in zip(inputs, done, strict=True)
        if g.merged is not None
    ]
    return results, bad


def loaded_trace(result: AnalyzedTrace, patterns: Patterns | None = None) -> Trace:
    """The result's trace, loaded again when the analysis did not keep it."""
    return result.trace if result.trace is not None else load_trace(list(result.paths), patterns)


def summary_frame(results: list[AnalyzedTrace]) -> pd.DataFrame:
    """One row per trace, fastest first, with labels unique across traces and speedup over naive."""
    rows = [{**r.analysis.summary.iloc[0].to_dict(), "trace": str(r.path), "sha256": r.sha256} for r in results]
    frame = pd.DataFrame(rows)
    dup = frame["implementation"].duplicated(keep=False)
    frame["label"] = np.where(
        dup, frame["implementation"] + " (" + frame["trace"].map(lambda p: Path(p).stem) + ")", frame["implementation"]
    )
    naive = frame.loc[frame["implementation"] == "naive", "step_ms"]
    frame["speedup_vs_naive"] = naive.iloc[0] / frame["step_ms"] if len(naive) else np.nan
    return frame.sort_values("step_ms", kind="stable", na_position="last").reset_index(drop=True)


def steps_frame(results: list[AnalyzedTrace], summary: pd.DataFrame) -> pd.DataFrame:
    """Every (trace, rank, step) row of the analyses with the trace's label."""
    labels = dict(zip(summary["trace"], summary["label"], strict=True))
    return pd.concat(
        [r.analysis.steps.assign(label=labels[str(r.path)], trace=str(r.path), sha256=r.sha256) for r in results],
        ignore_index=True,
    )
