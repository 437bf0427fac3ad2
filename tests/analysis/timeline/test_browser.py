"""Open generated pages in headless Chromium: plots rendered, expected traces, no console errors.

Screenshots go to the git-ignored `screenshots/` folder at the repository root, for a human to look at.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from analysis.render.html_page import write_page
from analysis.run.loaded_run import load_trace, measure_run
from analysis.timeline import command as timeline
from analysis.timeline.figure import build_figure
from analysis.timeline.lanes import Selection
from analysis.timeline.timeline_page import trace_panel
from tests.analysis.timeline.test_timeline_traces import write_trace
from tests.support.html_check import check_page, find_chromium

pytestmark = [
    pytest.mark.browser,  # opens its pages in the session's headless Chromium
    pytest.mark.skipif(find_chromium() is None, reason="no chromium on PATH: run `bash scripts/install_chromium.sh`"),
]
REPO = Path(__file__).resolve().parents[3]
SHOTS = REPO / "screenshots"
REAL = REPO / ".." / "shared" / "data" / "nsys2026_2xH100_torchrun.sqlite"


def expected_traces(paths, selection: Selection) -> int:
    """How many plotly traces the timeline of these exports holds (built again in Python)."""
    from analysis.overlap.analyze import analyze_trace

    runs = [measure_run(load_trace(p)) for p in paths]
    panels = [trace_panel(p, selection, r, analyze_trace(r.trace).steps)[0] for p, r in zip(paths, runs, strict=True)]
    return len(build_figure(panels).data)


def expected_side_by_side(paths) -> int:
    """How many plotly traces the report's side-by-side page of these exports holds (built again in Python)."""
    from analysis.overlap.analyze import analyze_trace
    from analysis.report.compare_page import compare_panel

    traces = [load_trace(p) for p in paths]
    panels = [compare_panel(t.implementation, "#000000", measure_run(t), analyze_trace(t).steps) for t in traces]
    return len(build_figure(panels).data)


def assert_rendered(chromium, page: Path, traces: int, shot: str, height: int = 1000) -> dict:
    check = check_page(page, screenshot=SHOTS / shot, height=height, browser=chromium)
    assert check.errors == []
    assert len(check.plots) == 1
    plot = check.plots[0]
    assert plot["traces"] == traces
    assert plot["svg_layers"] >= 1 and plot["gl_canvases"] >= 1  # plotly's SVG and WebGL layers
    assert (SHOTS / shot).stat().st_size > 10_000
    return plot


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    folder = tmp_path_factory.mktemp("browser")
    return {
        name: write_trace(folder / f"{name}.sqlite", name.split("_")[0], gpu=not name.endswith("cpu"))
        for name in ("naive", "overlap", "naive_cpu", "overlap_cpu")
    }


def test_naive_vs_overlap_timeline_renders(traces, tmp_path, chromium):
    page = tmp_path / "naive_vs_overlap.html"
    paths = [traces["naive"], traces["overlap"]]
    assert timeline.main([*map(str, paths), "-o", str(page), "--step", "1"]) == 0
    plot = assert_rendered(chromium, page, expected_traces(paths, Selection(step=1)), "timeline_naive_vs_overlap.png")
    assert plot["types"].count("scattergl") == plot["traces"]  # lanes, hover markers and step numbers: WebGL


def test_cpu_only_timeline_renders(traces, tmp_path, chromium):
    page = tmp_path / "cpu.html"
    paths = [traces["naive_cpu"], traces["overlap_cpu"]]
    assert timeline.main([*map(str, paths), "-o", str(page)]) == 0
    assert_rendered(chromium, page, expected_traces(paths, Selection()), "timeline_cpu_only.png", height=800)


@pytest.mark.skipif(not REAL.exists(), reason="real trace not present (../shared/data)")
def test_real_trace_timeline_renders(tmp_path, chromium):
    page = tmp_path / "real.html"
    assert timeline.main([str(REAL), "-o", str(page)]) == 0
    assert_rendered(chromium, page, expected_traces([REAL], Selection()), "timeline_real_h100.png", height=700)


def test_gpu_step_timeline_renders_with_its_shading(gpu_trace, tmp_path, chromium):
    """One step of the real torch H100 trace (host not syncing): the page renders."""
    path = gpu_trace("torch.sqlite")
    page = tmp_path / "torch_step4.html"
    assert timeline.main([str(path), "-o", str(page), "--step", "4"]) == 0
    expected = expected_traces([path], Selection(step=4))
    assert_rendered(chromium, page, expected, "timeline_gpu_torch_step4.png", height=800)


def test_the_check_sees_javascript_errors(tmp_path, chromium):
    page = write_page(tmp_path / "broken.html", "broken", ["<script>undefinedFunction();</script>"])
    check = check_page(page, browser=chromium)
    assert check.plots == []
    assert any("undefinedFunction" in e for e in check.errors)


def test_report_pages_render(traces, tmp_path, chromium):
    from analysis.report import command as report

    out = tmp_path / "reports"
    assert report.main([str(traces["naive"]), str(traces["overlap"]), "-o", str(out)]) == 0
    check = check_page(out / "index.html", screenshot=SHOTS / "report_index.png", height=1500, browser=chromium)
    assert check.errors == []
    # breakdown, spread; Collectives: per trace wait vs transfer (two bars + the step's length), the straggler
    # chart, and the calls of each step its drop-down offers (wait, all-reduce transfer, issue dots; 3 steps of
    # the opened rank and the other rank in the opened step)
    collectives = [(3, "bar"), (2, "bar"), (3 * 4, "bar")] * 2
    assert [(p["traces"], p["types"][0]) for p in check.plots] == [(4, "bar"), (2, "box"), *collectives]
    assert all(p["svg_layers"] >= 1 for p in check.plots)
    paths = [traces["naive"], traces["overlap"]]
    assert_rendered(
        chromium,
        out / "timelines" / "side_by_side.html",
        expected_side_by_side(paths),
        "report_naive_vs_overlap.png",
    )
