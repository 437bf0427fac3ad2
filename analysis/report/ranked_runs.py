"""The report's runs analysed, hashed and ranked: what `python -m analysis.report` writes out.

The runs come from session.OpenRuns (read once: in one piece, or file by file in --jobs processes
or on a Dask cluster), each with the sha256 of its files' bytes, which keys the report's results.db
rows; `summary_frame` ranks the runs and `steps_frame` lists their steps.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np
import pandas as pd

from analysis.errors import TraceError
from analysis.overlap.analyze import Analysis, selected
from analysis.parallel.file_task import FileResult, analyze_file
from analysis.run.run_files import RunFiles, distinct_names
from analysis.trace.patterns import Patterns

if TYPE_CHECKING:
    from analysis.collectives.collectives_view import CollectivesView
    from analysis.parallel.per_file import RunResult
    from analysis.run.loaded_run import LoadedRun


class ReportRuns(Protocol):
    """The open runs as the report reads them (session.OpenRuns, which documents each; named here so the
    report does not import the module that calls it)."""

    runs: list[RunFiles]

    def loaded(self, i: int) -> LoadedRun: ...

    def results(self) -> list[RunResult]: ...

    def errors(self) -> list[str]: ...

    def check_selection(self, step: int | None = None, rank: int | None = None) -> None: ...

    def collectives(
        self, rank: int | None = None, step: int | None = None, peak_busbw: float | None = None
    ) -> CollectivesView: ...


@dataclass(frozen=True)
class AnalyzedTrace:
    """One run of the report: its label (the path, or the rank files' pattern), name, content hash,
    analysis, files, and its index among the OpenRuns' runs (what loads its trace)."""

    path: str
    name: str
    sha256: str
    index: int
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
    """One file's analysis with its content hash (runs in worker processes: see parallel/pool.py)."""
    return replace(analyze_file(path, patterns), sha256=content_hash(path))


def analyze_all(runs: ReportRuns, step: int | None = None, rank: int | None = None) -> list[AnalyzedTrace]:
    """Every run analysed (runs.results()) and hashed, only step/rank when given; a TraceError naming
    what the runs have when they lack it, or the failed runs' errors when a run failed."""
    done = runs.results()
    if runs.errors():
        raise TraceError("; ".join(runs.errors()))
    runs.check_selection(step, rank)  # across every run: a run may lack what another has
    results = []
    for i, r in enumerate(done):
        if r.analysis is None:
            continue
        hashes = [f.sha256 for f in r.files if f.sha256] or [content_hash(p) for p in r.run.paths]
        if not _has(r.analysis, step, rank):
            continue  # a run without that rank or step: another has it
        mine = selected(r.analysis, step, rank)
        results.append(AnalyzedTrace(r.run.label, r.run.name, group_sha256(hashes), i, mine, r.run.paths))
    return results


def _has(result: Analysis, step: int | None, rank: int | None) -> bool:
    """Whether the run has rank `rank` and (on that rank) step `step`, None meaning any."""
    steps = result.steps if rank is None else result.steps[result.steps["rank"] == rank]
    if rank is not None and rank not in set(result.totals["rank"]):
        return False
    return step is None or step in set(steps["step"].dropna().astype(int))


def summary_frame(results: list[AnalyzedTrace]) -> pd.DataFrame:
    """One row per trace, fastest first, with speedup over naive and a label unique across traces: the
    implementation, and where two traces share it, each one's shortest distinct name after it
    (run_files.distinct_names: `fsdp (a/fsdp)`, `fsdp (b/fsdp)` for a/fsdp.sqlite and b/fsdp.sqlite)."""
    rows = [{**r.analysis.summary.iloc[0].to_dict(), "trace": str(r.path), "sha256": r.sha256} for r in results]
    frame = pd.DataFrame(rows)
    dup = frame["implementation"].duplicated(keep=False)
    names = distinct_names([RunFiles(r.name, tuple(map(Path, r.paths or (r.path,)))) for r in results])
    frame["label"] = np.where(dup, frame["implementation"] + " (" + pd.Series(names) + ")", frame["implementation"])
    if frame["label"].duplicated().any():  # an implementation named like another's label: say the whole path
        frame["label"] = np.where(dup, frame["implementation"] + " (" + frame["trace"] + ")", frame["implementation"])
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
