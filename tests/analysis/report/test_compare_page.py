"""The side-by-side page: implementations stacked fastest first on one time scale, each panel one step of
one rank with its backward pass outlined; checked on the figure object."""

from __future__ import annotations

import pytest

from analysis.measure.rank_spans import backward_spans
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
        panels.append(compare_panel(kind, colour, run, steps))
    path, fig = write_compare(tmp_path / "side.html", panels, list(runs))
    titles = [a.text for a in fig.layout.annotations]
    for (kind, (_, steps)), title, panel in zip(runs.items(), titles, panels, strict=True):
        step, rank = representative_step(steps)
        assert f"<b>{kind}</b> — step {step}, rank {rank}: step " in title
        assert palette.IMPLEMENTATION_COLOURS[kind] in title
        assert set(panel.lanes["rank"]) == {rank}  # one rank's lanes
    bands = [s for s in fig.layout.shapes if s.name == "backward pass" and s.visible is not False]
    assert len(bands) == 2 and sum(bool(s.showlegend) for s in bands) == 1  # one legend entry for all panels
    for (run, steps), panel, band in zip(runs.values(), panels, bands, strict=True):  # each its own step's only
        step, rank = representative_step(steps)
        span = backward_spans(run.trace).query("rank == @rank and step == @step").iloc[0]
        assert band.x0 == pytest.approx((span["start_ns"] - panel.origin_ns) / 1e6)
        assert band.x1 == pytest.approx((span["end_ns"] - panel.origin_ns) / 1e6)
    assert all(a.xanchor == "left" and a.x == 0 for a in fig.layout.annotations)  # titles clear of the legend
    page = path.read_text()
    assert "<title>Side by side: overlap, naive</title>" in page


def test_each_panel_switches_to_every_step_of_its_rank_and_every_rank_of_its_step(runs, tmp_path):
    """A drop-down per panel lists the run's steps of the opened rank, then its other ranks in the opened step;
    each choice titles the panel with that step's figures from the raw per-step rows, shows that rank's lanes
    and outlines that step's backward pass from that step's start, and touches no other panel."""
    panels = [compare_panel(k, "#000000", run, steps) for k, (run, steps) in runs.items()]
    path, fig = write_compare(tmp_path / "side.html", panels, list(runs))
    assert "the drop-down left of each panel" in path.read_text()
    shapes = fig.layout.shapes
    for row, (menu, (run, steps)) in enumerate(zip(fig.layout.updatemenus, runs.values(), strict=True), start=1):
        step, rank = representative_step(steps)
        expected = [(int(k), rank) for k in sorted(steps.loc[steps["rank"] == rank, "step"])]
        expected += [(step, int(r)) for r in sorted(steps["rank"].unique()) if r != rank]
        assert [b.label for b in menu.buttons] == [f"step {k}, rank {r}" for k, r in expected]
        assert menu.buttons[menu.active].label == f"step {step}, rank {rank}"
        y_axis = "yaxis" if row == 1 else f"yaxis{row}"
        for button, (k, r) in zip(menu.buttons, expected, strict=True):
            visible, layout, indices = button.args
            assert all(fig.data[i].xaxis == ("x" if row == 1 else f"x{row}") for i in indices)  # this panel's only
            assert sum(visible["visible"]) > 0
            at = steps.loc[(steps["step"] == k) & (steps["rank"] == r)].iloc[0]
            assert layout[f"annotations[{row - 1}].text"].endswith(
                f"step {k}, rank {r}: step {at['step_ms']:.2f} ms, comm {at['comm_ms']:.2f} ms, "
                f"overlapped {at['overlap_pct']:.1f}%, exposed comm {at['exposed_comm_ms']:.2f} ms"
            )
            assert all(label.startswith(f"r{r} ") for label in layout[f"{y_axis}.ticktext"])
            start = run.step_starts.query("rank == @r and step == @k")["start_ns"].iloc[0]
            span = backward_spans(run.trace).query("rank == @r and step == @k").iloc[0]
            (band,) = [
                shapes[int(key[7:-9])]
                for key, on in layout.items()
                if key.endswith(".visible") and on and shapes[int(key[7:-9])].name == "backward pass"
            ]
            assert band.x0 == pytest.approx((span["start_ns"] - start) / 1e6)
            assert band.x1 == pytest.approx((span["end_ns"] - start) / 1e6)


def test_timeline_titles_carry_the_implementation_colour(runs):
    from analysis.timeline.lanes import Selection
    from analysis.timeline.timeline_page import trace_panel

    run, steps = runs["naive"]
    panel, _ = trace_panel(str(run.trace.path), Selection(), run, steps)
    assert f"color:{palette.IMPLEMENTATION_COLOURS['naive']}" in panel.title and "<b>naive</b>" in panel.title
    spare = palette.SPARE_IMPLEMENTATION_COLOURS[0]  # a report's second naive run
    assert f"color:{spare}" in trace_panel(str(run.trace.path), Selection(), run, steps, colour=spare)[0].title


def test_the_plot_is_tall_enough_for_its_legend(runs, tmp_path):
    from analysis.timeline.figure import LEGEND_ROW_PX

    run, steps = runs["overlap"]
    _, fig = write_compare(tmp_path / "one.html", [compare_panel("overlap", "#000000", run, steps)], ["o"])
    shown = [t for t in fig.data if t.visible is not False], [s for s in fig.layout.shapes if s.visible is not False]
    entries = sum(bool(t.showlegend) for t in shown[0]) + sum(bool(s.showlegend) for s in shown[1])  # hidden: none
    plot_px = fig.layout.height - fig.layout.margin.t - fig.layout.margin.b
    assert entries >= 8 and plot_px >= LEGEND_ROW_PX * entries  # no scrolling legend beside a short plot
