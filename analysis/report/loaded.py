"""Runs already open, as the report takes them: `LoadedRuns`, what session.OpenRuns offers (each run's
measure_runs.RunResult and its LoadedRun). Kept below session so report_runs and report_folder, which
session.OpenRuns.report calls, take the open runs without importing the module that calls them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from analysis.overlap.analyze import Analysis
from analysis.parallel.measure_runs import RunResult
from analysis.run.run_files import RunFiles

if TYPE_CHECKING:
    from analysis.collectives.collectives_view import CollectivesView
    from analysis.measure.loaded_run import LoadedRun
    from analysis.trace.frames import Trace
    from analysis.trace.patterns import Patterns


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
