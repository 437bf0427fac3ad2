"""What a page looks like in a real browser, read from its DOM: each plotly figure's traces and points,
its plot areas, legend, toolbar (modebar) and buttons as boxes on the page, and lane heights.

`inspect(tab)` waits until every figure has drawn, then measures; `problems(layout)` lists what a
reader would not accept: a figure without data, a lane under 20 px, a legend over a plot area, the
toolbar or the buttons.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from tests.support.devtools import Browser, PageLog, Tab

MIN_LANE_PX = 20.0
TOLERANCE_PX = 1.0  # boxes that touch along an edge do not overlap

# Resolves once every plot has a laid-out figure and its SVG, then two animation frames later
# (plotly draws WebGL traces in the frame after newPlot resolves).
MEASURE = r"""
(async () => {
  const plots = () => Array.from(document.querySelectorAll('.js-plotly-plot'));
  const t0 = performance.now();
  while (plots().some(gd => !gd._fullLayout || !gd.querySelector('svg.main-svg'))) {
    if (performance.now() - t0 > 30000) break;
    await new Promise(r => setTimeout(r, 50));
  }
  for (let i = 0; i < 3; i++) await new Promise(r => requestAnimationFrame(r));
  const box = el => { if (!el) return null; const r = el.getBoundingClientRect();
    return [r.left + scrollX, r.top + scrollY, r.right + scrollX, r.bottom + scrollY]; };
  const points = t => t._length != null ? t._length
    : Math.max((t.x || []).length, (t.y || []).length, (t.values || []).length);
  return {
    page: [document.documentElement.scrollWidth, document.documentElement.scrollHeight],
    load_ms: performance.now(),
    plots: plots().map(gd => {
      const fl = gd._fullLayout || {};
      const lanes = Object.keys(fl).filter(k => /^yaxis\d*$/.test(k)).map(k => fl[k])
        .filter(ax => ax.tickmode === 'array' && (ax.tickvals || []).length && ax.range)
        .map(ax => ({axis: ax._name, lanes: ax.tickvals.length,
                     lane_px: ax._length / Math.abs(ax.range[1] - ax.range[0])}));
      return {
        id: gd.id,
        box: box(gd),
        traces: (gd._fullData || []).map(t => ({type: t.type, name: t.name, visible: t.visible,
                                                points: points(t)})),
        plot_areas: Array.from(gd.querySelectorAll('.draglayer .nsewdrag')).map(box),
        legend: fl.showlegend ? box(gd.querySelector('.legend .bg')) : null,
        modebar: box(gd.querySelector('.modebar')),
        buttons: Array.from(gd.querySelectorAll('.updatemenu-container .updatemenu-button')).map(box),
        gl_canvases: gd.querySelectorAll('canvas').length,
        x_range: fl.xaxis ? fl.xaxis.range : null,
        lanes: lanes,
      };
    }),
  };
})()
"""


@dataclass(frozen=True)
class PageLayout:
    """One page as the browser drew it."""

    page: Path
    plots: list[dict]
    log: PageLog
    size: tuple[int, int]  # scroll width and height, px
    load_ms: float  # navigation start to the end of the measurement (all figures drawn)


# The top of the first <h2> whose text starts with a given heading, in page pixels.
HEADING_TOP = """(() => { const h = Array.from(document.querySelectorAll('h2')).find(e => e.textContent.startsWith(%s));
  return h ? h.getBoundingClientRect().top + scrollY : null; })()"""

CONTENT_BOTTOM = """Math.max(...Array.from(document.body.children)
  .map(e => e.getBoundingClientRect().bottom + scrollY))"""


def screenshot_region(
    tab: Tab, size: tuple[int, int], region: str, height: int
) -> tuple[float, float, float, float] | None:
    """The clip of a screenshot region: "screen" (the viewport), "page" (all of it), or "h2:Heading"
    (`height` pixels from that heading down)."""
    if region == "screen":
        return None
    if region == "page":  # down to the end of the content, not of a taller viewport
        bottom = tab.evaluate(CONTENT_BOTTOM)
        return (0, 0, size[0], min(size[1], bottom + 20))
    if region.startswith("h2:"):
        top = tab.evaluate(HEADING_TOP % json.dumps(region[3:]))
        if top is None:
            raise ValueError(f"no <h2> starting with {region[3:]!r} on the page")
        top = max(top - 10, 0)
        return (0, top, size[0], min(height, size[1] - top))
    raise ValueError(f"region {region!r}: expected screen, page or h2:<heading>")


def measure(tab: Tab, page: Path) -> PageLayout:
    """The open page as drawn now."""
    measured = tab.evaluate(MEASURE)
    return PageLayout(Path(page), measured["plots"], tab.log(), tuple(measured["page"]), measured["load_ms"])


def inspect(browser: Browser, page: Path, screenshot: Path | None = None, region: str = "screen") -> PageLayout:
    """Open the page, measure it once drawn, optionally save a screenshot of one region of it
    (see screenshot_region)."""
    tab = browser.open(page)
    layout = measure(tab, page)
    if screenshot is not None:
        tab.screenshot(screenshot, screenshot_region(tab, layout.size, region, browser.height))
    return layout


# Clicks the plotly button (updatemenu) with this label the way a mouse does; false when there is none.
CLICK_BUTTON = """(async () => {
  const b = Array.from(document.querySelectorAll('.updatemenu-button')).find(e => e.textContent.trim() === %s);
  if (!b) return false;
  b.dispatchEvent(new MouseEvent('click', {bubbles: true}));
  await new Promise(r => setTimeout(r, 200));
  return true; })()"""


def click_button(tab: Tab, label: str) -> bool:
    """Click the figure button labelled `label`; False when the page has none."""
    return bool(tab.evaluate(CLICK_BUTTON % json.dumps(label)))


def overlap_px(a: list[float] | None, b: list[float] | None) -> float:
    """Area of the intersection of two [left, top, right, bottom] boxes, ignoring edge contact."""
    if a is None or b is None:
        return 0.0
    w = min(a[2], b[2]) - max(a[0], b[0]) - TOLERANCE_PX
    h = min(a[3], b[3]) - max(a[1], b[1]) - TOLERANCE_PX
    return max(w, 0.0) * max(h, 0.0)


def plot_problems(plot: dict) -> list[str]:
    """What is wrong with one figure as drawn."""
    name = plot["id"]
    out = []
    shown = [t for t in plot["traces"] if t["visible"] is True]
    if not any(t["points"] > 0 for t in shown):
        out.append(f"{name}: no visible trace has data")
    out += [
        f"{name}: {a['axis']} lanes are {a['lane_px']:.1f} px high" for a in plot["lanes"] if a["lane_px"] < MIN_LANE_PX
    ]
    if plot["legend"] is not None:
        if plot["legend"][2] - plot["legend"][0] < 1 or plot["legend"][3] - plot["legend"][1] < 1:
            out.append(f"{name}: the legend is not drawn")
        for i, area in enumerate(plot["plot_areas"]):
            if overlap_px(plot["legend"], area) > 0:
                out.append(f"{name}: the legend {plot['legend']} covers plot area {i} {area}")
        if overlap_px(plot["legend"], plot["modebar"]) > 0:
            out.append(f"{name}: the legend {plot['legend']} is under the toolbar {plot['modebar']}")
        for button in plot["buttons"]:
            if overlap_px(plot["legend"], button) > 0:
                out.append(f"{name}: the legend {plot['legend']} covers a button {button}")
    for i, button in enumerate(plot["buttons"]):
        if overlap_px(button, plot["modebar"]) > 0:
            out.append(f"{name}: button {i} {button} is under the toolbar {plot['modebar']}")
    return out


def problems(layout: PageLayout) -> list[str]:
    """Everything a reader would not accept on the page, as one line each; [] when it is fine."""
    out = [f"network request: {u}" for u in layout.log.network()]
    out += layout.log.errors
    if not layout.plots:
        out.append("no plotly figure on the page")
    for plot in layout.plots:
        out += plot_problems(plot)
    return out
