"""Runs already open, as the report takes them: `RunResult` (one run's analysis) and `LoadedRuns`, what
session.OpenRuns offers. Kept below session so report_runs and report_folder, which session.OpenRuns.report
calls, take the open runs without importing the module that calls them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import pandas as pd

from analysis.engine.analyze import Analysis
from analysis.engine.file_task import FileResult
from analysis.engine.runs import RunFiles

if TYPE_CHECKING:
    from analysis.engine.collectives_view import CollectivesView
    from analysis.frames.patterns import Patterns
    from analysis.frames.trace import Trace
    from analysis.measures.loaded_run import LoadedRun


@dataclass(frozen=True)
class RunResult:
    """One run's analysis: the run, its Analysis, its per-step view across ranks, and (per-file
    path) the files' results; `error`: the one-line error when it failed (then analysis is None)."""

    run: RunFiles
    analysis: Analysis | None
    across_ranks: pd.DataFrame
    files: tuple[FileResult, ...] = ()
    error: str | None = None
    failed: tuple[Path, ...] = ()
    call_rows: tuple[pd.DataFrame, dict, pd.DataFrame] | None = None


class LoadedRuns(Protocol):
    """The runs of an OpenRuns and what the report asks of them (session.OpenRuns documents each)."""

    runs: list[RunFiles]
    patterns: Patterns

    def loaded(self, i: int) -> LoadedRun: ...

    def trace(self, i: int) -> Trace: ...

    def results(self) -> list[RunResult]: ...

    def errors(self) -> list[str]: ...

    def overlap(self, step: int | None = None, rank: int | None = None) -> Analysis: ...

    def check_selection(self, step: int | None = None, rank: int | None = None) -> None: ...

    def collectives(
        self, rank: int | None = None, step: int | None = None, peak_busbw: float | None = None
    ) -> CollectivesView: ...
