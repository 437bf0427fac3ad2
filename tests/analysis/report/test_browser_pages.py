"""Every page type opened in headless Chromium over the DevTools protocol and checked from its DOM:
every figure has data, timeline lanes are at least 20 px high, no legend covers a plot area, the
toolbar or the buttons, no console error, and no request leaves the machine's files.

Pages: `analysis.report`'s index and its naive-vs-best comparison and per-trace timelines, on the real
H100 fixtures (on a CPU run recorded with `run_nsys.sh`: test_browser_cpu_pages.py, apart so that these
need not wait for the recordings); `analysis.timeline`; `analysis.collectives --prefetch-chart`. One
browser serves the whole module.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from analysis.collectives import command as collectives
from analysis.render.export import find_chromium
from analysis.render.html_page import write_page
from analysis.report import command as report
from analysis.timeline import command as timeline
from tests.analysis.fsdp_units.test_prefetch import write_fsdp2_shaped
from tests.support.devtools import Browser
from tests.support.page_layout import MIN_LANE_PX, PageLayout, click_button, inspect, measure, problems

pytestmark = [
    pytest.mark.browser,  # starts headless Chromium (and reads whole real traces)
    pytest.mark.skipif(find_chromium() is None, reason="no chromium on PATH: run `bash scripts/install_chromium.sh`"),
]
GPU_RUNS = ("naive", "flat", "overlap", "overlap_bucket", "torch")


@pytest.fixture(scope="module")
def browser(chromium) -> Browser:
    return chromium  # the session's (1400 x 1000)


@pytest.fixture(scope="module")
def gpu_report(gpu_trace, tmp_path_factory) -> Path:
    """analysis.report of the five H100 runs (../shared/data/gpu_h100)."""
    out = tmp_path_factory.mktemp("gpu_report")
    assert report.main([str(gpu_trace(f"{name}.sqlite")) for name in GPU_RUNS] + ["-o", str(out)]) == 0
    return out


def assert_fine(layout: PageLayout, figures: int) -> None:
    assert problems(layout) == []
    assert len(layout.plots) == figures
    assert [u for u in layout.log.requests if u.startswith("file:")], "the page itself was requested"


def assert_timeline(layout: PageLayout, panels: int) -> None:
    """One figure of `panels` stacked panels, each with its lanes, every lane >= 20 px."""
    assert_fine(layout, 1)
    (plot,) = layout.plots
    assert len(plot["lanes"]) == panels
    assert all(axis["lane_px"] >= MIN_LANE_PX and axis["lanes"] >= 4 for axis in plot["lanes"])
    assert plot["gl_canvases"] >= 1  # the lanes are WebGL
    assert plot["legend"] is not None


def test_gpu_report_index(browser, gpu_report):
    layout = inspect(browser, gpu_report / "index.html")
    assert_fine(layout, len(layout.plots))
    assert len(layout.plots) >= 4  # breakdown, spread and the collectives' charts
    assert {t["type"] for p in layout.plots for t in p["traces"]} >= {"bar", "box"}
    bundle = next(gpu_report.glob("plotly-*.min.js"))
    assert bundle.resolve().as_uri() in layout.log.requests  # plotly.js from the report folder


ITEMS = "Array.from(document.querySelectorAll('.updatemenu-dropdown-button'))"  # an open drop-down's choices
# The centre of an element (scrolled into view) in viewport pixels, for a real mouse click; null when none.
CENTRE = """(async () => { const el = %s; if (!el) return null; el.scrollIntoView({block: 'center'});
  await new Promise(r => requestAnimationFrame(r)); const r = el.getBoundingClientRect();
  return [r.left + r.width / 2, r.top + r.height / 2]; })()"""
# What the second panel shows: its title, its lanes, and its visible traces (name, points).
SECOND_PANEL = """(() => { const gd = document.querySelector('.js-plotly-plot'); const fl = gd._fullLayout;
  return {title: fl.annotations[1].text, lanes: fl.yaxis2.ticktext, traces: gd.data.length,
          shown: gd._fullData.filter(t => t.visible === true && t.yaxis === 'y2')
                             .map(t => [t.name, t._length])}; })()"""


def click(tab, element: str) -> None:
    """A mouse click (pressed and released) on the element the JavaScript expression finds."""
    x, y = tab.evaluate(CENTRE % element)
    for kind in ("mousePressed", "mouseReleased"):
        event = {"type": kind, "x": x, "y": y, "button": "left", "clickCount": 1}
        tab.browser.call("Input.dispatchMouseEvent", event, session=tab.session)
    tab.evaluate("new Promise(r => setTimeout(r, 300))")


def test_gpu_report_comparison_page(browser, gpu_report):
    """Five panels; the second panel's drop-down (opened with the mouse) switches it to another rank: its
    title names that step and rank, its lanes are that rank's, and it draws that view's lines and strip."""
    page = gpu_report / "timelines" / "side_by_side.html"
    tab = browser.open(page)
    assert_timeline(measure(tab, page), panels=len(GPU_RUNS))
    opened = tab.evaluate(SECOND_PANEL)
    click(tab, "document.querySelectorAll('.updatemenu-header-group')[1].querySelector('.updatemenu-header')")
    labels = tab.evaluate(ITEMS + ".map(e => e.textContent)")
    assert len(labels) >= 2 and labels[-1] != labels[0]
    step, rank = (int(x.split()[-1]) for x in labels[-1].split(", "))  # "step K, rank R": another rank
    click(tab, ITEMS + f".find(e => e.textContent === {labels[-1]!r})")
    switched = tab.evaluate(SECOND_PANEL)
    assert switched["traces"] == opened["traces"]  # the hidden views were in the page all along
    assert f"step {step}, rank {rank}: step " in switched["title"] and switched["title"] != opened["title"]
    assert switched["lanes"] and all(lane.startswith(f"r{rank} ") for lane in switched["lanes"])
    assert not any(lane.startswith(f"r{rank} ") for lane in opened["lanes"])
    names = {name for name, points in switched["shown"] if points > 0}
    assert {"forward", "backward", "comm exposed"} <= names
    assert problems(measure(tab, page)) == []


def test_gpu_report_timeline_of_one_run(browser, gpu_report):
    """The biggest page (overlap: 1096 all-reduce kernels a rank): one step shown, and the "whole run"
    button shows every step on the same lanes, still with data, lanes and a clear legend."""
    page = gpu_report / "timelines" / "overlap.html"
    tab = browser.open(page)
    step = measure(tab, page)
    assert_timeline(step, panels=1)
    assert len(step.plots[0]["buttons"]) == 2  # one step / whole run
    assert click_button(tab, "whole run")
    whole = measure(tab, page)
    assert_timeline(whole, panels=1)
    (lo, hi), (whole_lo, whole_hi) = step.plots[0]["x_range"], whole.plots[0]["x_range"]
    assert whole_hi - whole_lo > 4 * (hi - lo)  # 10 steps, or at least 5 of them, in view
    shown = lambda layout: {i for i, t in enumerate(layout.plots[0]["traces"]) if t["visible"] is True}
    assert shown(step) and shown(whole) and not shown(step) & shown(whole)  # the other level's traces


def test_gpu_timeline_of_one_step_self_contained(browser, gpu_trace, tmp_path):
    """`--step 3 --self-contained`: a single file that needs nothing else, not even the folder's plotly.js."""
    page = tmp_path / "torch_step3.html"
    assert timeline.main([str(gpu_trace("torch.sqlite")), "-o", str(page), "--step", "3", "--self-contained"]) == 0
    layout = inspect(browser, page)
    assert_timeline(layout, panels=1)
    assert layout.log.requests == [page.resolve().as_uri()]


def test_prefetch_chart_page(browser, tmp_path):
    trace = write_fsdp2_shaped(tmp_path / "fsdp2.sqlite")
    page = tmp_path / "prefetch.html"
    assert collectives.main([str(trace), "--prefetch-chart", str(page)]) == 0
    layout = inspect(browser, page)
    assert_fine(layout, 2)
    assert [t["points"] for t in layout.plots[0]["traces"]] == [2]  # per unit: both late (CPU: waited)
    assert [t["points"] for t in layout.plots[1]["traces"]] == [2, 2, 2]  # gathers, waits, forward began


def test_the_checks_catch_what_they_look_for(browser, tmp_path):
    """A page with a legend over its plot, squeezed lanes, a figure without data and a CDN script."""
    import plotly.graph_objects as go

    legend_inside = go.Figure(go.Bar(x=["a", "b"], y=[1, 2], name="bars", showlegend=True))
    legend_inside.update_layout(legend=dict(x=0.4, y=0.6), height=300)
    squeezed = go.Figure(go.Scatter(x=[0, 1], y=[0, 39], mode="lines"))
    squeezed.update_yaxes(tickmode="array", tickvals=list(range(40)), ticktext=[f"lane {i}" for i in range(40)])
    squeezed.update_yaxes(range=[39.5, -0.5])
    squeezed.update_layout(height=400)
    empty = go.Figure(go.Bar(x=[], y=[]))
    page = write_page(
        tmp_path / "bad.html",
        "bad",
        [legend_inside, squeezed, empty, '<script src="https://cdn.example.invalid/lib.js"></script>'],
    )
    found = problems(inspect(browser, page))
    assert any("the legend" in p and "covers plot area 0" in p for p in found), found
    assert any("yaxis lanes are" in p for p in found), found
    assert any("no visible trace has data" in p for p in found), found
    assert "network request: https://cdn.example.invalid/lib.js" in found
