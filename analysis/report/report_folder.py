"""Writing the comparison report folder from runs already open: `write_report(runs, out) -> ReportResult`.

What `python -m analysis.report` writes, and what `OpenRuns.report(out)` writes, is this module's:
index.html (ranking table, per-step breakdown, step spread, collectives, links), timelines/<run>.html
(one per run), timelines/side_by_side.html (two runs or more), plotly-<version>.min.js (unless the
pages are self-contained), summary.csv, results.db, and with `images` every figure as PNG/SVG in img/.
Files in the folder that this tool did not write are refused before any analysis (and again before
any writing); the runs are read once, by the OpenRuns that holds them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from analysis.errors import TraceError
from analysis.render.export import FORMATS as IMAGE_FORMATS, Image, check_export, refuse_existing, write_images
from analysis.render.html_page import BESIDE_THE_PAGE, PLOTLY_FILE, PlotlyJs
from analysis.report.compare_page import PAGE_NAME as COMPARE_PAGE
from analysis.report.html_report import write_index
from analysis.report.ranked_runs import AnalyzedTrace, analyze_all, steps_frame, summary_frame
from analysis.report.report_files import SUMMARY_COLUMNS, check_out_dir, check_replaces, record_history, remove_stale
from analysis.run.run_files import shown_files
from analysis.timeline.lanes import Selection

if TYPE_CHECKING:
    from analysis.report.ranked_runs import ReportRuns

IMAGES = "img"  # the report folder's image subfolder
TIMELINE_PX = 1600  # image width of the timeline pages (the index's figures: export.DEFAULT_WIDTH_PX)


@dataclass(frozen=True)
class ReportResult:
    """A written report folder. `timelines`: each run's page by run label (empty without timelines);
    `side_by_side`: the one-step comparison page (two runs or more); `plotly_js`: the plotly.js file the
    pages load (None when self-contained); `images`: the PNG/SVG files written; `summary`: one row per
    run, fastest first (summary.csv's columns, plus `label`, the run's name on the pages); `steps`:
    every (run, rank, step) row shown."""

    folder: Path
    index: Path
    timelines: dict[str, Path]
    side_by_side: Path | None
    summary_csv: Path
    results_db: Path
    plotly_js: Path | None
    images: tuple[Path, ...]
    summary: pd.DataFrame
    steps: pd.DataFrame

    def notes(self) -> dict[str, str]:
        """Each run's missing-ranks note by label ('ranks 0 of 2 ...'), runs without one left out."""
        return {str(k): str(v) for k, v in zip(self.summary["label"], self.summary["ranks_note"], strict=True) if v}


class RunsFailed(TraceError):
    """Some runs could not be analysed; `results`: every loaded.RunResult, the failed ones carrying
    their one-line error (cli.report_failures prints them as the CLIs do)."""

    def __init__(self, results: Sequence):
        self.results = list(results)
        super().__init__("; ".join(r.error for r in self.results if r.error is not None))


def timeline_names(traces: list[tuple[str, str]]) -> dict[str, str]:
    """timelines/<name>.html per (label, name) of a trace, numbered when two traces share a name."""
    names: dict[str, str] = {}
    seen: dict[str, int] = {}
    for label, name in traces:
        n = seen.get(name, 0)
        seen[name] = n + 1
        names[label] = f"timelines/{name}{'' if n == 0 else f'_{n}'}.html"
    return names


def check_report_folder(runs: ReportRuns, out: Path, timelines: bool = True, self_contained: bool = False) -> None:
    """Refuse `out` when it is a file or holds pages, a summary.csv, a results.db or a plotly.js of
    the report's names that this tool did not write (report_files.check_out_dir); reads no trace."""
    check_out_dir(out, _pages(runs, timelines), self_contained)


def _pages(runs: ReportRuns, timelines: bool) -> list[str]:
    """The report's pages besides index.html."""
    if not timelines:
        return []
    pages = list(timeline_names([(r.label, r.name) for r in runs.runs]).values())
    return [*pages, COMPARE_PAGE] if pages and len(runs.runs) > 1 else pages


def _check_options(peak_busbw: float | None, images: Sequence[str]) -> None:
    if peak_busbw is not None and not peak_busbw > 0:
        raise TraceError(f"--peak-busbw {peak_busbw}: must be a positive number of GB/s")
    unknown = [f for f in images if f not in IMAGE_FORMATS]
    if unknown:
        raise TraceError(f"image format {unknown[0]!r}: expected one of {', '.join(IMAGE_FORMATS)}")


def write_report(
    runs: ReportRuns,
    out: Path,
    *,
    step: int | None = None,
    rank: int | None = None,
    timelines: bool = True,
    peak_busbw: float | None = None,
    self_contained: bool = False,
    images: Sequence[str] = (),
    progress: Callable[[str], object] | None = None,
    overwrite: bool = False,
) -> ReportResult:
    """The report folder of the open runs (module docstring), only step/rank when given; a TraceError
    (before anything is written) for a folder holding files not ours, or a report of other runs unless
    `overwrite` (which then removes the pages that report wrote and this one does not), a step or rank
    the runs lack, a bad option; RunsFailed when a run could not be analysed."""
    say = progress or (lambda _: None)
    _check_options(peak_busbw, images)
    pages = _pages(runs, timelines)
    check_out_dir(out, pages, self_contained)  # fail before the (slow) analysis when we can
    replaced = check_replaces(out, [r.label for r in runs.runs], overwrite)
    chromium = check_export(images) if images else ""  # no kaleido or Chromium: say so before the analysis
    if runs.errors():
        raise RunsFailed(runs.results())
    results = analyze_all(runs, step, rank)
    summary = summary_frame(results)
    check_out_dir(out, pages, self_contained)  # every output, before writing any
    ours = (out / "index.html").is_file()  # check_out_dir let it pass: the folder is a report of ours
    out.mkdir(parents=True, exist_ok=True)
    record_history(out / "results.db", results, summary)  # first: the one that can refuse late
    selection = Selection(step=step, rank=rank)
    plotly_js = PlotlyJs(self_contained=self_contained, folder=out)
    links, side, figures = (
        ({}, None, []) if not timelines else write_timelines(out, runs, results, summary, selection, plotly_js, say)
    )
    steps = steps_frame(results, summary)
    index, index_figures = write_index(
        out / "index.html",
        summary,
        steps,
        links,
        (side, "Side by side: " + ", ".join(summary["label"])) if side else None,
        collectives_blocks(runs, results, summary, peak_busbw, step, rank),
        plotly_js,
    )
    summary[SUMMARY_COLUMNS].to_csv(out / "summary.csv", index=False)
    say(f"wrote {out / 'results.db'}, {index}, {out / 'summary.csv'}")
    written: list[Path] = []
    if images:
        figures += [Image(f, out / IMAGES / f"index_{f.layout.meta['image']}") for f in index_figures]
        refuse_existing(figures, images, ours)
        t0 = time.perf_counter()
        written = write_images(figures, images, chromium)
        say(f"wrote {len(written)} images into {out / IMAGES} ({time.perf_counter() - t0:.1f} s)")
    if replaced:  # only with overwrite: check_replaces refused the folder otherwise
        kept = [out / name for name in links.values()] + ([out / side] if side else []) + written
        stale = remove_stale(out, kept)
        if stale:
            say(f"removed {len(stale)} pages and images of the earlier report that this one does not have")
    return ReportResult(
        folder=out,
        index=Path(index),
        timelines={label: out / name for label, name in links.items()},
        side_by_side=out / side if side else None,
        summary_csv=out / "summary.csv",
        results_db=out / "results.db",
        plotly_js=None if self_contained else out / PLOTLY_FILE,
        images=tuple(written),
        summary=summary,
        steps=steps,
    )


def write_timelines(
    out: Path,
    runs: ReportRuns,
    results: list[AnalyzedTrace],
    summary: pd.DataFrame,
    selection: Selection,
    plotly_js: PlotlyJs = BESIDE_THE_PAGE,
    say: Callable[[str], object] = lambda _: None,
) -> tuple[dict, str | None, list[Image]]:
    """One overview timeline per trace and, with two traces or more, the side-by-side page (one step of
    each, fastest first); returns the per-trace links, the side-by-side page's name (or None) and the
    pages' figures as images to export (img/<page name>)."""
    from analysis.report.compare_page import compare_panel, write_compare
    from analysis.report.html_report import label_colours
    from analysis.timeline.lanes import run_segments
    from analysis.timeline.timeline_page import trace_panel, write_timeline
    from analysis.trace.run_info import labelled, summary_notes

    names = timeline_names([(r.path, r.name) for r in results])
    labels = dict(zip(summary["trace"], summary["label"], strict=True))
    shown = dict(zip([r.path for r in results], shown_files([r.path for r in results]), strict=True))
    colours = label_colours(summary)
    design = dict(zip(summary["label"], summary_notes(summary), strict=True))
    compared = {}
    images = []
    for r in results:
        t0 = time.perf_counter()
        run = runs.loaded(r.index)
        segments = run_segments(run)  # once: the run's timeline page and its side-by-side panel draw it
        label = labels[str(r.path)]
        panel, _ = trace_panel(
            r.path,
            selection,
            run,
            r.analysis.steps,
            colour=colours[label],
            file_name=shown[r.path],
            segments=segments,
        )
        title, notes = f"Timeline: {label}", labelled([label], [design[label]])
        _, fig = write_timeline([panel], out / names[r.path], title, selection, plotly_js=plotly_js, notes=notes)
        images.append(Image(fig, out / IMAGES / ("timeline_" + Path(names[r.path]).stem), TIMELINE_PX))
        if len(results) > 1:
            compared[label] = compare_panel(label, colours[label], run, r.analysis.steps, segments=segments)
        say(f"timeline of {r.path} ({time.perf_counter() - t0:.1f} s)")
    if not compared:
        return names, None, images
    order = [x for x in summary["label"] if x in compared]  # fastest first
    notes = labelled(order, [design[x] for x in order])
    _, fig = write_compare(out / COMPARE_PAGE, [compared[x] for x in order], order, plotly_js, notes=notes)
    images.append(Image(fig, out / IMAGES / Path(COMPARE_PAGE).stem, TIMELINE_PX))
    return names, COMPARE_PAGE, images


def collectives_blocks(
    runs: ReportRuns,
    results: list[AnalyzedTrace],
    summary: pd.DataFrame,
    peak_busbw: float | None,
    step: int | None = None,
    rank: int | None = None,
) -> list:
    """The index page's Collectives section (report/report_collectives.py), one entry per run, fastest
    first, from the same loaded runs."""
    from analysis.report.html_report import label_colours
    from analysis.report.report_collectives import CollectivesEntry, collectives_section

    by_trace = {str(r.path): r for r in results}
    colours = label_colours(summary)
    view = runs.collectives(rank=rank, step=step)
    entries = []
    for path, label in zip(summary["trace"], summary["label"], strict=True):  # one per run
        r = by_trace[path]
        mine = view.only(r.analysis.summary["path"].iloc[0])
        loaded = runs.loaded(r.index)
        entries.append(CollectivesEntry(label, loaded, mine, r.analysis.steps, colours[label], r.analysis.by_group))
    return collectives_section(entries, peak_busbw)
