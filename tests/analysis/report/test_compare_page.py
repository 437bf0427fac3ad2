"""The side-by-side page: implementations stacked fastest first on one time scale, each panel one step of
one rank with its backward pass outlined; checked on the figure object."""

from __future__ import annotations

import pytest

from analysis.measure.backward_span import backward_spans
from analysis.overlap.analyze import analyze_trace
from analysis.render import palette
from analysis.report.compare_page import compare_panel, write_compare
from analysis.run.loaded_run import load_trace, measure_run
from analysis.timeline.representative import representative_step
from tests.analysis.timeline.test_timeline_traces import write_trace


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("compare")
    out = {}
    for kind in ("overlap", "naive"):
        trace = load_trace([write_trace(folder / f"{kind}.sqlite", kind, steps=4)])
        out[kind] = (measure_run(trace), analyze_trace(trace).steps)
    return out


def test_panels_stack_in_the_order_given_each_one_step_of_one_rank_with_backward_outlined(runs, tmp_path):
    panels = []
    for kind, (run, steps) in runs.items():
        colour = palette.IMPLEMENTATION_COLOURS[kind]
        panels.append(compare_panel(kind, colour, str(run.trace.path), run, steps))
    path, fig = write_compare(tmp_path / "side.html", panels, list(runs))
    titles = [a.text for a in fig.layout.annotations]
    for (kind, (_, steps)), title, panel in zip(runs.items(), titles, panels, strict=True):
        step, rank = representative_step(steps)
        assert f"<b>{kind}</b> — step {step}, rank {rank}: step " in title
        assert palette.IMPLEMENTATION_COLOURS[kind] in title
        assert set(panel.lanes["rank"]) == {rank}  # one rank's lanes
    bands = [s for s in fig.layout.shapes if s.name == "backward pass"]
    assert len(bands) == 2 and sum(bool(s.showlegend) for s in bands) == 1  # one legend entry for all panels
    for (run, steps), panel, band in zip(runs.values(), panels, bands, strict=True):  # each its own step's only
        step, rank = representative_step(steps)
        span = backward_spans(run.trace).query("rank == @rank and step == @step").iloc[0]
        assert band.x0 == pytest.approx((span["start_ns"] - panel.origin_ns) / 1e6)
        assert band.x1 == pytest.approx((span["end_ns"] - panel.origin_ns) / 1e6)
    assert all(a.xanchor == "left" and a.x == 0 for a in fig.layout.annotations)  # titles clear of the legend
    page = path.read_text()
    assert "<title>Side by side: overlap, naive</title>" in page


def test_timeline_titles_carry_the_implementation_colour(runs):
    from analysis.timeline.lanes import Selection
    from analysis.timeline.timeline_page import trace_panel

    run, steps = runs["naive"]
    panel, _ = trace_panel(str(run.trace.path), Selection(), run, steps)
    assert f"color:{palette.IMPLEMENTATION_COLOURS['naive']}" in panel.title and "<b>naive</b>" in panel.title
    spare = palette.SPARE_IMPLEMENTATION_COLOURS[0]  # a report's second naive run
    assert f"color:{spare}" in trace_panel(str(run.trace.path), Selection(), run, steps, colour=spare)[0].title


def test_the_plot_is_tall_enough_for_its_legend(runs, tmp_path):
    from analysis.timeline.render_figure import LEGEND_ROW_PX

    run, steps = runs["overlap"]
    _, fig = write_compare(tmp_path / "one.html", [compare_panel("overlap", "#000000", "o", run, steps)], ["o"])
    entries = sum(bool(t.showlegend) for t in fig.data) + sum(bool(s.showlegend) for s in fig.layout.shapes)
    plot_px = fig.layout.height - fig.layout.margin.t - fig.layout.margin.b
    assert entries >= 8 and plot_px >= LEGEND_ROW_PX * entries  # no scrolling legend beside a short plot
