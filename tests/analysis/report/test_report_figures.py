"""The report's figures keep its rules: one colour per implementation on every chart, fastest first
everywhere, 'comm range' on CPU traces, per-call charts of the longest calls plus 'others' on an axis
in ms of the step, and titles that quote the same figures as the table. Checked on the figure
objects and page HTML (the browser tests check the rendered pages)."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest

from analysis.collectives.collectives_view import collectives_of
from analysis.overlap.analyze import analyze_trace
from analysis.render import palette
from analysis.report.call_chart import calls_figure, longest_calls
from analysis.report.html_report import breakdown_figure, label_colours, link_list, spread_figure, table_html
from analysis.report.report_collectives import (
    CollectivesEntry,
    collectives_section,
    step_time_split,
    wait_transfer_figure,
)
from analysis.run.loaded_run import load_trace, measure_run
from analysis.trace.frames import KERNELS, RANGES
from tests.analysis.timeline.test_timeline_traces import write_trace

MS = 1_000_000  # ns, as integers

SUMMARY = pd.DataFrame(  # fastest first, as summary_frame sorts it; two runs of naive
    {
        "implementation": ["overlap", "naive", "naive", "mystery"],
        "label": ["overlap", "naive (a)", "naive (b)", "mystery"],
        "trace": ["o.sqlite", "a.sqlite", "b.sqlite", "m.sqlite"],
        "step_ms": [80.0, 90.0, 91.0, 99.0],
        "compute_ms": [60.0, 60.0, 60.0, 60.0],
        "overlap_ms": [10.0, 0.0, 0.0, 0.0],
        "exposed_comm_ms": [5.0, 15.0, 16.0, 20.0],
        "comm_ms": [15.0, 15.0, 16.0, 20.0],
    }
)


def test_each_trace_keeps_its_implementation_colour_and_repeats_get_spares():
    colours = label_colours(SUMMARY)
    assert colours["overlap"] == palette.IMPLEMENTATION_COLOURS["overlap"]
    assert colours["naive (a)"] == palette.IMPLEMENTATION_COLOURS["naive"]
    assert colours["naive (b)"] in palette.SPARE_IMPLEMENTATION_COLOURS
    assert colours["mystery"] in palette.SPARE_IMPLEMENTATION_COLOURS
    assert len(set(colours.values())) == 4  # every trace apart
    categories = {*palette.PHASE_COLOURS.values(), *palette.COLLECTIVE_COLOURS.values()}
    categories |= {palette.HIDDEN_COMM, palette.EXPOSED_COMM, palette.COMPUTE_ONLY, palette.WAITING}
    assert not set(colours.values()) & categories  # a colour never names both a run and a kind of work


def test_index_charts_and_table_are_fastest_first_in_the_implementation_colours():
    colours = label_colours(SUMMARY)
    order = SUMMARY["label"].tolist()
    steps = pd.concat(  # the per-step frame comes in input order, not the ranking's
        [
            pd.DataFrame({"label": label, "step_ms": [ms, ms + 1]})
            for label, ms in zip(order[::-1], [9, 8, 7, 6], strict=True)
        ]
    )
    spread = spread_figure(steps, SUMMARY)
    assert [box.name for box in spread.data] == order
    assert [box.marker.color for box in spread.data] == [colours[x] for x in order]
    for fig in (spread, breakdown_figure(SUMMARY)):
        ticks = fig.layout.xaxis
        assert list(ticks.tickvals) == order
        assert [re.search(r"color:(#\w+)", t).group(1) for t in ticks.ticktext] == [colours[x] for x in order]
    table = table_html(SUMMARY, {})
    swatches = re.findall(r'class="swatch" style="background:(#\w+)"', table)
    assert swatches == [colours[x] for x in order]
    links = link_list({t: f"timelines/{t}.html" for t in SUMMARY["trace"][::-1]}, None, SUMMARY)
    assert re.findall(r'href="timelines/(\w)\.sqlite', links) == ["o", "a", "b", "m"]


def _calls(n: int, source: str = KERNELS) -> pd.DataFrame:
    """n calls of rank 0 step 1, the k-th lasting k+1 ms (so the longest are the last), some overlapping."""
    rng = np.random.default_rng(3)
    start = np.sort(rng.integers(0, 200, n)) * MS
    duration = (np.arange(n) + 1) * MS // 4
    return pd.DataFrame(
        {
            "rank": 0,
            "step": 1,
            "op": "all_reduce",
            "tag": [f"bucket{i}" for i in range(n)],
            "source": source,
            "issue_ns": start - MS,
            "start_ns": start,
            "end_ns": start + duration,
            "duration_ms": duration / MS,
            "wait_ms": np.where(np.arange(n) % 2 == 0, duration / MS / 2, np.nan),
        }
    )


def test_per_call_chart_draws_the_longest_calls_and_merges_the_rest_on_one_row():
    calls = _calls(300)
    fig = calls_figure(calls, 1, 0, "naive", step_start_ns=-5 * MS, backward=(0, 100 * MS), top=20)
    rows = list(fig.layout.yaxis.categoryarray)
    kept, rest = longest_calls(calls, 20)
    assert rows[:20] == kept["tag"].tolist() and rows[20] == "others (280 kernels)" and len(rows) == 21
    assert set(kept["tag"]) == {f"bucket{i}" for i in range(280, 300)}  # the 20 longest
    others = next(t for t in fig.data if t.name.startswith("other kernels"))
    # the others' bars are the union of their spans: as long as a brute-force count of covered microseconds
    covered = np.zeros(400_000, dtype=bool)
    for s, e in zip(rest["start_ns"] // 1000, rest["end_ns"] // 1000, strict=True):
        covered[s:e] = True
    assert sum(others.x) == pytest.approx(covered.sum() / 1000, abs=1e-6)
    assert min(others.base) == pytest.approx((rest["start_ns"].min() + 5 * MS) / MS)  # ms of the step
    assert fig.layout.xaxis.title.text == "ms from the step's start" and fig.layout.xaxis.range[0] == 0
    assert fig.layout.height <= 170 + 22 * 21


def test_cpu_traces_say_comm_range_not_kernel():
    fig = calls_figure(_calls(5, source=RANGES), 1, 0, "naive", None, None)
    names = [t.name for t in fig.data]
    assert names and not any("kernel" in n for n in names) and any(n.startswith("comm range:") for n in names)
    bars = wait_transfer_figure(_calls(5, source=RANGES), "naive")
    assert all("comm range" in t.name for t in bars.data)
    assert [t.marker.color for t in bars.data] == [palette.COLLECTIVE_COLOURS["all_reduce"], palette.WAITING]


def test_step_split_counts_overlapping_calls_once_in_ms_of_the_step():
    calls = pd.concat([_calls(40), _calls(30).assign(rank=1), _calls(10).assign(step=2)], ignore_index=True)
    calls["op"] = np.where(np.arange(len(calls)) % 3 == 0, "_allgather_base", "all_reduce")
    split = step_time_split(calls).set_index(["step", "rank"])
    for (step, rank), mine in calls.groupby(["step", "rank"]):
        busy = np.zeros(400_000, dtype=bool)
        moving = np.zeros(400_000, dtype=bool)
        wait_us = np.rint(np.nan_to_num(mine["wait_ms"].to_numpy()) * 1000).astype(int)
        for s, e, w in zip(mine["start_ns"] // 1000, mine["end_ns"] // 1000, wait_us, strict=True):
            busy[s:e] = True
            moving[s + w : e] = True
        got = split.loc[(step, rank)]
        assert got["busy_ms"] == pytest.approx(busy.sum() / 1000)
        assert got["transfer_ms"] == pytest.approx(moving.sum() / 1000)
        assert got["waiting_ms"] == pytest.approx((busy & ~moving).sum() / 1000)
        # by collective: all-reduce first (palette order), all-gather gets only what all-reduce left
        reduce_only = np.zeros(400_000, dtype=bool)
        is_reduce = (mine["op"] == "all_reduce").to_numpy()
        reduce = mine[is_reduce]
        for s, e, w in zip(reduce["start_ns"] // 1000, reduce["end_ns"] // 1000, wait_us[is_reduce], strict=True):
            reduce_only[s + w : e] = True
        assert got["transfer_all_reduce_ms"] == pytest.approx(reduce_only.sum() / 1000)
        assert got["transfer_all_gather_ms"] == pytest.approx((moving & ~reduce_only).sum() / 1000)


@pytest.fixture(scope="module")
def entries(tmp_path_factory):
    folder = tmp_path_factory.mktemp("figures")
    out = []
    for kind in ("overlap", "naive"):  # fastest first: overlap hides its communication
        trace = load_trace([write_trace(folder / f"{kind}.sqlite", kind, steps=4)])
        steps = analyze_trace(trace).steps
        colour = palette.IMPLEMENTATION_COLOURS[kind]
        out.append(CollectivesEntry(kind, measure_run(trace), collectives_of([trace]), steps, colour))
    return out


def test_the_per_call_title_quotes_the_tables_figures(entries):
    blocks = collectives_section(entries)
    titles = [b.layout.title.text for b in blocks if not isinstance(b, str) and "rank" in b.layout.title.text]
    assert [t.split(":")[0] for t in titles] == ["overlap", "naive"]  # in the order given: fastest first
    for entry, title in zip(entries, titles, strict=True):
        step, rank = map(int, re.search(r"step (\d+), rank (\d+)", title).groups())
        row = entry.steps.loc[(entry.steps["step"] == step) & (entry.steps["rank"] == rank)].iloc[0]
        assert f"{row['exposed_comm_ms']:.2f} ms of communication exposed" in title
        assert f"{row['overlap_ms']:.2f} ms hidden" in title
        mean = analyze_trace(entry.run.trace).summary["exposed_comm_ms"].iloc[0]  # the table's figure
        assert f"mean per step: {mean:.2f} ms exposed" in title
    headings = [b for b in blocks if isinstance(b, str) and 'class="impl"' in b]
    assert [palette.IMPLEMENTATION_COLOURS[k] in h for k, h in zip(("overlap", "naive"), headings, strict=True)]


@pytest.mark.parametrize(
    ("gbps", "unit", "shown"), [(1.2e-4, "KB/s", 120.0), (0.25, "MB/s", 250.0), (42.0, "GB/s", 42.0)]
)
def test_bus_bandwidth_axis_reads_in_a_unit_that_fits_the_values(gbps, unit, shown):
    from analysis.report.report_collectives import busbw_figure

    calls = pd.DataFrame({"label": ["a", "a"], "bytes": [1000, 2000], "busbw_gbps": [gbps, gbps], "tag": ["x", "y"]})
    fig = busbw_figure(calls, peak_busbw=100.0)
    assert fig.layout.yaxis.title.text == f"busbw {unit}" and fig.layout.yaxis.exponentformat == "none"
    assert list(fig.data[0].y) == pytest.approx([shown, shown]) and unit in fig.data[0].hovertemplate
    assert fig.layout.shapes[0].y0 == pytest.approx(100.0 * shown / gbps)  # the peak in the same unit
