"""Open a generated page in headless Chromium and report what actually rendered.

The page is copied next to itself with two small scripts injected: one at the top of <head> that
records console errors, uncaught exceptions and the page's start time, one at the end of <body>
that, once loaded, counts each plot's traces, its SVG and WebGL layers and writes the result as
JSON into the DOM, which `--dump-dom` hands back. The original file is never modified.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from analysis.render.export import find_chromium

if TYPE_CHECKING:
    from tests.support.devtools import Browser

# Headless, offline, no first-run work; SwiftShader gives WebGL without a GPU.
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--enable-unsafe-swiftshader",
    "--use-angle=swiftshader",
    "--hide-scrollbars",
)

HEAD_PROBE = """<script>
window.__probe = {t0: performance.now(), errors: []};
(function () {
  var orig = console.error;
  console.error = function () {
    window.__probe.errors.push(Array.prototype.map.call(arguments, String).join(' '));
    return orig.apply(console, arguments);
  };
  window.addEventListener('error', function (e) { window.__probe.errors.push('uncaught: ' + e.message); });
  window.addEventListener('unhandledrejection', function (e) {
    window.__probe.errors.push('unhandled rejection: ' + String(e.reason));
  });
})();
</script>"""

BODY_PROBE = """<script>
window.addEventListener('load', function () {
  var plots = Array.prototype.map.call(document.querySelectorAll('.js-plotly-plot'), function (gd) {
    return {id: gd.id, traces: (gd.data || []).length,
            types: (gd.data || []).map(function (t) { return t.type || 'scatter'; }),
            svg_layers: gd.querySelectorAll('svg.main-svg').length,
            gl_canvases: gd.querySelectorAll('canvas').length,
            fill_paths: gd.querySelectorAll('.scatterlayer path.js-fill').length};
  });
  var out = document.createElement('pre');
  out.id = 'render-probe';
  out.textContent = JSON.stringify({plots: plots, errors: window.__probe.errors,
                                    render_ms: performance.now() - window.__probe.t0});
  document.body.appendChild(out);
});
</script>"""


@dataclass(frozen=True)
class PageCheck:
    """What a headless browser saw on a page."""

    plots: list[dict]
    errors: list[str]
    render_ms: float  # page start to load event (all plots drawn), measured in the page
    wall_s: float  # whole browser run, start-up included


def _absolute_scripts(text: str, page: Path) -> str:
    """Relative `<script src>` paths (the folder's plotly.js) made absolute file URIs, so the copy in
    another folder loads the same files."""

    def absolute(m: re.Match) -> str:
        src = m.group(1)
        if re.match(r"^[a-z]+:", src):
            return m.group(0)
        return f'src="{(page.parent / src).resolve().as_uri()}"'

    return re.sub(r'src="([^"]+)"', absolute, text)


def _probed_copy(page: Path, folder: Path) -> Path:
    """A copy of the page with the probe scripts injected."""
    text = _absolute_scripts(page.read_text(encoding="utf-8"), page)
    text = text.replace("<head>", "<head>" + HEAD_PROBE, 1).replace("</body>", BODY_PROBE + "</body>", 1)
    copy = folder / page.name
    copy.write_text(text, encoding="utf-8")
    return copy


def _run_chromium(args: list[str], profile: Path, timeout_s: float) -> subprocess.CompletedProcess:
    exe = find_chromium()
    if exe is None:
        raise RuntimeError("no chromium on PATH (bash scripts/install_chromium.sh installs it)")
    cmd = [exe, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0", *args]
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout_s, env={**os.environ, "HOME": str(profile)}
    )


def console_errors(stderr: str) -> list[str]:
    """Console error lines Chromium logged for the page (JavaScript errors, failed fetches)."""
    lines = [ln for ln in stderr.splitlines() if "CONSOLE" in ln or "Uncaught" in ln]
    return [ln for ln in lines if "ERROR" in ln or "Uncaught" in ln or "Failed to load" in ln]


# The probe's result, once the page's load handlers (the body probe among them) have run.
PROBE_RESULT = """new Promise(function (done) {
  (function poll() {
    var out = document.getElementById('render-probe');
    if (out) { done(out.textContent); } else { setTimeout(poll, 20); }
  })();
})"""


def check_page(
    page: Path,
    screenshot: Path | None = None,
    width: int = 1600,
    height: int = 1200,
    timeout_s: float = 120.0,
    browser: Browser | None = None,
) -> PageCheck:
    """Render `page` headless; optionally also save a screenshot of the first `height` pixels. With
    `browser` (a tests.support.devtools.Browser, started once for many pages) the page opens in a tab of
    it; else in a Chromium of its own (two: the DOM, then the screenshot)."""
    page = Path(page).resolve()
    if browser is not None:
        return _check_in(browser, page, screenshot, width, height)
    with tempfile.TemporaryDirectory(prefix="html_check_") as tmp_name:
        tmp = Path(tmp_name)
        probed = _probed_copy(page, tmp)
        t0 = time.perf_counter()
        run = _run_chromium(["--dump-dom", probed.as_uri()], tmp / "profile", timeout_s)
        wall = time.perf_counter() - t0
        dom = run.stdout
        start = dom.find('<pre id="render-probe">')
        if start < 0:
            raise RuntimeError(f"page did not finish loading in Chromium: {run.stderr.strip()[-300:]}")
        end = dom.find("</pre>", start)
        raw = dom[start + len('<pre id="render-probe">') : end]
        probe = json.loads(raw.replace("&quot;", '"').replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&"))
        errors = probe["errors"] + console_errors(run.stderr)
        if screenshot is not None:
            screenshot = Path(screenshot).resolve()
            screenshot.parent.mkdir(parents=True, exist_ok=True)
            _run_chromium(
                [
                    f"--screenshot={screenshot}",
                    f"--window-size={width},{height}",
                    "--virtual-time-budget=3000",
                    page.as_uri(),
                ],
                tmp / "profile2",
                timeout_s,
            )
    return PageCheck(plots=probe["plots"], errors=errors, render_ms=probe["render_ms"], wall_s=wall)


def _check_in(browser: Browser, page: Path, screenshot: Path | None, width: int, height: int) -> PageCheck:
    """check_page in a tab of a running browser: the probed copy opened, read, screenshot, closed."""
    with tempfile.TemporaryDirectory(prefix="html_check_") as tmp_name:
        probed = _probed_copy(page, Path(tmp_name))
        t0 = time.perf_counter()
        tab = browser.open(probed, width=width, height=height)
        try:
            probe = json.loads(tab.evaluate(PROBE_RESULT))
            wall = time.perf_counter() - t0
            errors = probe["errors"] + tab.log().errors
            if screenshot is not None:
                tab.screenshot(Path(screenshot).resolve())
        finally:
            tab.close()
    return PageCheck(plots=probe["plots"], errors=errors, render_ms=probe["render_ms"], wall_s=wall)
