"""`analysis.report`'s pages of a CPU run recorded with `run_nsys.sh` (naive and overlap, the session's
recordings: tests/support/recordings.py), opened in headless Chromium and checked from their DOM as
test_browser_pages.py checks the GPU ones."""

from __future__ import annotations

import pytest

from analysis.render.export import find_chromium
from analysis.report import command as report
from tests.analysis.report.test_browser_pages import assert_fine, assert_timeline
from tests.support.page_layout import inspect

pytestmark = [
    pytest.mark.browser,  # starts headless Chromium
    pytest.mark.skipif(find_chromium() is None, reason="no chromium on PATH: run `bash scripts/install_chromium.sh`"),
]


def test_cpu_report_pages(chromium, nsys_recordings, tmp_path):
    cpu_traces = nsys_recordings("naive", "overlap")
    out = tmp_path / "report"
    assert report.main([str(cpu_traces / "naive.sqlite"), str(cpu_traces / "overlap.sqlite"), "-o", str(out)]) == 0
    index = inspect(chromium, out / "index.html")
    assert_fine(index, len(index.plots))
    assert len(index.plots) >= 2
    assert_timeline(inspect(chromium, out / "timelines" / "side_by_side.html"), panels=2)
    assert_timeline(inspect(chromium, out / "timelines" / "naive.html"), panels=1)
