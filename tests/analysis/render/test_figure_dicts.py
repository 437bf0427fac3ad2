"""Figures built as dicts and handed to plotly unchecked (render/figure_dicts.py) are what plotly's own
validation makes of them: every figure of every page of a report, validated afresh, serialises the same."""

from __future__ import annotations

import json

import plotly.graph_objects as go
import plotly.io as pio
import pytest
from plotly.subplots import make_subplots

from analysis import open_runs
from analysis.render.figure_dicts import TEMPLATE, stacked_layout, trusted_figure
from tests.analysis.timeline.test_timeline_traces import write_trace


def page_figures(page: str) -> list[dict]:
    """The data and layout of every Plotly.newPlot call in a page."""
    decoder, out, at = json.JSONDecoder(), [], 0
    while (at := page.find("Plotly.newPlot(", at)) >= 0:
        at = page.index(",", at) + 1  # past the div id
        parts = []
        for _ in range(2):  # data, layout
            while page[at] in " ,\n":
                at += 1
            value, at = decoder.raw_decode(page, at)
            parts.append(value)
        out.append({"data": parts[0], "layout": parts[1]})
    return out


def test_trusted_figure_takes_the_template_and_the_dicts_as_given():
    fig = trusted_figure([{"type": "bar", "x": [1, 2], "y": [3, 4]}], {"height": 300})
    assert fig.layout.template.to_plotly_json() == pio.templates[TEMPLATE].to_plotly_json()
    assert fig.layout.height == 300 and list(fig.data[0].x) == [1, 2]
    validated = go.Figure(fig.to_dict())
    assert json.loads(validated.to_json()) == json.loads(fig.to_json())


def test_every_figure_of_a_report_is_unchanged_by_plotly_validation(tmp_path):
    traces = [write_trace(tmp_path / f"{k}.sqlite", k) for k in ("naive", "overlap")]
    out = tmp_path / "report"
    open_runs(traces).report(out, peak_busbw=100.0)  # the peak line: the bandwidth chart's hline too
    pages = sorted(out.rglob("*.html"))
    assert [p.relative_to(out).as_posix() for p in pages] == [
        "index.html",
        "timelines/naive.html",
        "timelines/overlap.html",
        "timelines/side_by_side.html",
    ]
    kinds = set()
    white = json.loads(go.Figure(layout={"template": TEMPLATE}).to_json())["layout"]["template"]
    for page in pages:
        figures = page_figures(page.read_text())
        assert figures, page
        for fig in figures:
            validated = go.Figure(fig)  # raises on any property plotly does not know
            assert json.loads(validated.to_json()) == json.loads(json.dumps(fig)), page
            kinds |= {t["type"] for t in fig["data"]}
            assert fig["layout"]["template"] == white, page  # every chart in the one template
    assert {"scattergl", "bar", "scatter", "box"} <= kinds  # timelines, per-call and per-step charts, spread


@pytest.mark.parametrize(
    "heights, spacing",
    [
        ([100], 0.0),
        ([100, 200], 0.0),
        ([100, 200], 0.1),
        ([232, 80, 166, 400, 212], 80 / 1090 * 0.8),
        ([1, 1000, 3], 0.01),
    ],
)
def test_stacked_layout_is_what_make_subplots_lays_out(heights, spacing):
    for titles in (
        [f"panel {i}<br>figures" for i in range(len(heights))],
        ["" if i % 2 else "t" for i in range(len(heights))],
    ):
        grid = make_subplots(
            rows=len(heights),
            cols=1,
            shared_xaxes=True,
            row_heights=heights,
            vertical_spacing=spacing,
            subplot_titles=titles,
        ).layout.to_plotly_json()
        grid.pop("template")
        assert json.loads(json.dumps(stacked_layout(titles, heights, spacing))) == json.loads(json.dumps(grid))
