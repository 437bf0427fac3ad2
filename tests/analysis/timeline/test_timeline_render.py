"""Rendering layer of the timelines: sub-pixel merging, figures, self-contained pages."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import pytest
from hypothesis import given, settings, strategies as st
from plotly.offline import get_plotlyjs

from analysis.measure import intervals
from analysis.render.html_page import page_html
from analysis.timeline.figure import build_figure, count_drawn_segments
from analysis.timeline.panel import Panel, _cummax_by_run, merge_subpixel
from analysis.timeline.style import CATEGORY_COLOURS


def segments(starts, durations, lane=0, category="compute", name="k"):
    starts = np.asarray(starts, dtype=np.int64)
    return pd.DataFrame(
        {
            "lane": lane,
            "start": starts,
            "end": starts + np.asarray(durations, dtype=np.int64),
            "category": category,
            "name": name,
            "phase": "backward",
            "stream": "7",
        }
    )


def test_wide_segments_are_kept_and_narrow_ones_merged_per_pixel():
    seg = pd.concat([segments([0, 1000], [500, 500]), segments([5000], [3000])], ignore_index=True)
    out = merge_subpixel(seg, pixel_ns=2000)
    # 0..500 and 1000..1500 share pixel column 0; the 3000 ns kernel is wider than a pixel.
    assert out[["start", "end", "count", "busy"]].values.tolist() == [[0, 1500, 2, 1000], [5000, 8000, 1, 3000]]
    assert out["name"].tolist() == ["k", "k"]  # a block keeps its first member's fields


def test_merging_twice_at_the_same_resolution_changes_nothing():
    rng = np.random.default_rng(3)
    starts = np.sort(rng.integers(0, 10_000_000, 5_000))
    seg = segments(starts, rng.integers(10, 20_000, starts.size))
    once = merge_subpixel(seg, pixel_ns=10_000)
    pd.testing.assert_frame_equal(merge_subpixel(once, pixel_ns=10_000), once)


def brute_force_blocks(seg: pd.DataFrame, pixel_ns: int) -> list[tuple]:
    """The merge in plain Python: per (lane, category), narrow segments by start, a new block where
    the next starts a pixel or more after everything so far ended; wide segments kept as they are."""
    out = []
    for (lane, category), mine in seg.groupby(["lane", "category"], sort=True):
        block = None
        for s, e, name in sorted(zip(mine["start"], mine["end"], mine["name"], strict=True), key=lambda x: x[0]):
            if e - s >= pixel_ns:
                out.append((lane, s, e, category, name, 1, e - s))
                continue
            if block is not None and s < block[2] + pixel_ns:
                block = (lane, block[1], max(block[2], e), category, block[4], block[5] + 1, block[6] + e - s)
                continue
            if block is not None:
                out.append(block)
            block = (lane, s, e, category, name, 1, e - s)
        if block is not None:
            out.append(block)
    return sorted(out, key=lambda b: (b[0], b[1], b[3]))


def test_merge_matches_a_plain_python_merge_on_random_lanes():
    rng = np.random.default_rng(7)
    n = 3_000
    starts = rng.integers(0, 50_000_000, n)
    seg = segments(starts, rng.integers(10, 40_000, n)).assign(
        lane=rng.integers(0, 3, n), category=rng.choice(["compute", "comm"], n), name=rng.choice(["a", "b"], n)
    )
    for pixel_ns in (1_000, 20_000, 500_000):
        out = merge_subpixel(seg, pixel_ns)
        got = sorted(
            zip(
                out["lane"],
                out["start"],
                out["end"],
                out["category"],
                out["name"],
                out["count"],
                out["busy"],
                strict=True,
            ),
            key=lambda b: (b[0], b[1], b[3]),
        )
        assert got == brute_force_blocks(seg, pixel_ns), pixel_ns


def test_merging_does_not_touch_the_callers_frame():
    seg = segments(np.arange(0, 100_000, 10), np.full(10_000, 5))
    before = seg.copy()
    merge_subpixel(seg, pixel_ns=1000)
    pd.testing.assert_frame_equal(seg, before)


@pytest.mark.real  # a million kernels
def test_a_million_narrow_kernels_become_at_most_one_block_per_pixel_column():
    rng = np.random.default_rng(1)
    starts = np.sort(rng.integers(0, 2_000_000_000, 1_000_000))
    seg = segments(starts, rng.integers(100, 1900, starts.size))
    out = merge_subpixel(seg, pixel_ns=2_000_000_000 / 1600)
    assert len(out) <= 1601
    assert out["count"].sum() == 1_000_000
    assert out["busy"].sum() == (seg["end"] - seg["start"]).sum()


def test_merging_rejects_a_non_positive_pixel():
    with pytest.raises(ValueError, match="pixel_ns"):
        merge_subpixel(segments([0], [1]), pixel_ns=0)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 300)), min_size=1, max_size=80), st.integers(1, 500))
def test_merged_blocks_conserve_work_and_cover_every_segment(rows, pixel):
    start = np.array([r[0] for r in rows])
    seg = segments(start, [r[1] for r in rows])
    out = merge_subpixel(seg, pixel_ns=pixel)
    assert out["count"].sum() == len(seg)
    assert out["busy"].sum() == (seg["end"] - seg["start"]).sum()
    # Every input segment lies inside some output block.
    inside = (seg["start"].to_numpy()[:, None] >= out["start"].to_numpy()[None, :]) & (
        seg["end"].to_numpy()[:, None] <= out["end"].to_numpy()[None, :]
    )
    assert inside.any(axis=1).all()


def test_close_intervals_merge_when_the_gap_is_below_a_pixel():
    s, e = intervals.union(np.array([10, 0, 29, 100]), np.array([20, 12, 40, 120]), gap=10)
    assert s.tolist() == [0, 100] and e.tolist() == [40, 120]
    s, e = intervals.union(np.array([0, 30]), np.array([10, 40]), gap=5)
    assert s.tolist() == [0, 30] and e.tolist() == [10, 40]


def panel(title, comm_start, overlap):
    lanes = pd.DataFrame({"lane": [0, 1, 2], "label": ["r0 backward", "r0 gpu compute", "r0 gpu comm"], "rank": 0})
    seg = pd.concat(
        [
            segments([0], [80_000_000], lane=0, category="backward", name="backward"),
            segments(np.arange(0, 80_000_000, 200_000), np.full(400, 60_000), lane=1),
            segments([comm_start], [20_000_000], lane=2, category="comm:all_reduce", name="ncclAllReduce"),
        ],
        ignore_index=True,
    )
    ov = (
        pd.DataFrame({"rank": [0], "start": [comm_start], "end": [comm_start + 20_000_000]})
        if overlap
        else pd.DataFrame(columns=["rank", "start", "end"])
    )
    return Panel(title, seg, lanes, origin_ns=0, window_ns=(0, 100_000_000), overlap=ov)


def test_figure_shares_colours_and_legend_across_panels():
    fig = build_figure([panel("naive", 80_000_000, False), panel("overlap", 50_000_000, True)])
    lines = [t for t in fig.data if isinstance(t, go.Scattergl) and t.mode == "lines"]
    assert len(lines) == 6  # three categories in each of two panels, all WebGL
    for t in lines:
        assert t.line.color == CATEGORY_COLOURS[t.legendgroup]
    assert sorted(t.legendgroup for t in lines if t.showlegend) == ["backward", "comm:all_reduce", "compute"]
    assert [t.name for t in lines if t.showlegend] == ["backward", "compute outside the phases", "all-reduce"]
    assert fig.layout.annotations[1].text == "overlap"
    assert not [t for t in fig.data if isinstance(t, go.Scatter) and t.fill]  # the strip replaced the shading
    assert count_drawn_segments(fig) == 2 * (1 + 400 + 1)
    assert not fig.layout.updatemenus  # no overview: no buttons


def test_legend_sits_right_of_the_plot_below_the_toolbar():
    fig = build_figure([panel("naive", 80_000_000, False)])
    assert fig.layout.legend.x > 1 and fig.layout.legend.y == 1 and fig.layout.legend.yanchor == "top"
    assert fig.layout.margin.r >= 200  # room for it inside the figure


def test_overview_is_drawn_hidden_and_buttons_switch_levels():
    step = panel("overlap", 50_000_000, True)
    whole = dataclasses.replace(step, window_ns=(-200_000_000, 300_000_000))
    fig = build_figure([dataclasses.replace(step, overview=whole)])
    visible = [t.visible is not False for t in fig.data]
    assert sum(visible) == len(fig.data) // 2  # the same traces again, hidden
    (menu,) = fig.layout.updatemenus
    one, run = menu.buttons
    assert one.args[0]["visible"] == visible and run.args[0]["visible"] == [not v for v in visible]
    assert one.args[1]["xaxis.range"] == [0.0, 100.0] and run.args[1]["xaxis.range"] == [-200.0, 300.0]
    assert list(fig.layout.xaxis.range) == [0.0, 100.0]  # opens on the step


def test_step_ranges_carry_their_number():
    lanes = pd.DataFrame({"lane": [0], "label": ["r0 CPU step"], "rank": 0})
    seg = segments([0, 50_000_000], [50_000_000, 100_000], lane=0, category="step", name="step 3")
    seg.loc[1, "name"] = "step 4"
    fig = build_figure([Panel("p", seg, lanes, origin_ns=0, window_ns=(0, 100_000_000))], width_px=1000)
    (labels,) = [t for t in fig.data if t.mode == "text"]
    assert list(labels.text) == ["step 3"]  # step 4 is 1 px wide at this zoom: no room for its number
    assert list(labels.x) == [25.0]


def test_hover_carries_name_phase_stream_and_numbers():
    fig = build_figure([panel("overlap", 50_000_000, True)])
    hover = next(t for t in fig.data if t.name == "hover" and t.legendgroup == "comm:all_reduce")
    comm = next(i for i, text in enumerate(hover.text) if "ncclAllReduce" in text)
    assert hover.hovertext[comm] == "backward; 7"
    assert hover.hovertemplate.startswith("<b>%{text}</b><br>%{hovertext}")
    assert hover.customdata[comm][:3].tolist() == [50.0, 20.0, 1]
    assert "duration" in hover.hovertemplate
    compute = next(t for t in fig.data if t.name == "hover" and t.legendgroup == "compute")
    # 60 us kernels with 140 us gaps: drawn apart (the gaps are wider than a 62.5 us pixel), but
    # hovered as one block: hover labels merge at HOVER_PX pixels (250 us), finer than a mouse picks.
    lines = next(t for t in fig.data if t.mode == "lines" and t.legendgroup == "compute")
    assert len(lines.x) == 3 * 400
    assert list(compute.text) == ["400 merged, first: k"] and compute.customdata[0][2] == 400


def test_hover_gives_the_bytes_of_a_comm_range():
    lanes = pd.DataFrame({"lane": [0], "label": ["r0 CPU comm"], "rank": 0})
    seg = segments([0], [10_000_000], category="comm:all_reduce", name="comm:all_reduce:b0").assign(bytes=25.5e6)
    fig = build_figure([Panel("p", seg, lanes, origin_ns=0, window_ns=(0, 20_000_000))])
    hover = next(t for t in fig.data if t.name == "hover")
    assert hover.hovertext[0].endswith("25.50 MB")


def test_sub_pixel_gaps_merge_and_visible_gaps_separate():
    # pixel = 1000 ns: kernels of 100 ns with 500 ns gaps form one run; a 1000 ns gap starts another.
    seg = segments([0, 600, 1200, 2300, 2900], [100] * 5)
    out = merge_subpixel(seg, pixel_ns=1000)
    assert out[["start", "end", "count"]].values.tolist() == [[0, 1300, 3], [2300, 3000, 2]]


def test_hover_names_merged_blocks_with_their_count():
    lanes = pd.DataFrame({"lane": [0], "label": ["r0 gpu"], "rank": 0})
    seg = segments(np.arange(0, 1_000_000, 1000), np.full(1000, 500))  # 1000 kernels in one ms
    fig = build_figure([Panel("p", seg, lanes, origin_ns=0, window_ns=(0, 1_600_000_000))], width_px=1600)
    hover = next(t for t in fig.data if t.name == "hover")
    assert list(hover.text) == ["1000 merged, first: k"]
    assert hover.customdata[0][2] == 1000 and hover.customdata[0][3] == pytest.approx(0.5)


def test_page_embeds_plotly_once_and_fetches_nothing():
    fig = build_figure([panel("a", 0, False)])
    text = page_html("t", [fig, "<p>between</p>", fig])
    assert text.count(get_plotlyjs()) == 1
    assert len(re.findall(r"<script[^>]*>", text)) == 3  # the library + one newPlot per figure
    assert not re.search(r"<script[^>]+src=", text)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(-(2**61), 2**61), st.booleans()), min_size=1, max_size=40),
    st.sampled_from([0, 10**18]),
)
def test_running_maximum_restarts_at_each_run(items, offset):
    values = np.array([v // 4 + offset for v, _ in items], dtype=np.int64)
    starts = np.array([i == 0 or s for i, (_, s) in enumerate(items)])
    expected, best = [], None
    for v, s in zip(values.tolist(), starts.tolist(), strict=True):
        best = v if s else max(best, v)
        expected.append(best)
    assert _cummax_by_run(values, starts).tolist() == expected
