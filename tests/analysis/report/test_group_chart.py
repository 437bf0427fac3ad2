"""The report's per-group view: for a run with several process groups, each rank's communication per group hidden
under compute and exposed, labelled by dimension, equal to a plain-Python computation over the export's raw tables;
a run with one group (a barrier's kernel outside the ranges folded into it) gets no such chart."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from analysis.overlap.analyze import analyze_trace
from analysis.report import command as report
from analysis.report.group_chart import group_blocks
from analysis.run.loaded_run import load_trace
from tests.analysis.collectives.test_groups import raw_calls, reference_overlap
from tests.support.synthetic_groups import write_hsdp_trace

NS_PER_MS = 1e6


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("gc")
    return {
        "two": write_hsdp_trace(folder / "two.sqlite", steps=2, calls=2),
        "one": write_hsdp_trace(folder / "one.sqlite", steps=2, calls=2, grouped=False, barrier=True),
    }


def test_bars_are_each_ranks_hidden_and_exposed_communication_per_group(runs):
    path = runs["two"]
    calls, compute = raw_calls(path)
    want = reference_overlap(calls, compute)  # (rank, group) -> (calls, comm ns, hidden ns)
    note, fig = group_blocks(analyze_trace(load_trace(path)).by_group, "hsdp", "hsdp")
    hidden, exposed = fig.data
    assert (hidden.name, exposed.name) == ("hidden under compute", "exposed")
    dims, ranks = hidden.x
    assert sorted(zip(dims, ranks, strict=True)) == sorted((g, f"rank {r}") for r, g in want)
    for dim, rank, h, e in zip(dims, ranks, hidden.y, exposed.y, strict=True):
        _, comm, hid = want[(int(rank.split()[1]), dim)]
        assert (h * NS_PER_MS, e * NS_PER_MS) == (pytest.approx(hid), pytest.approx(comm - hid))
    for dim in ("shard", "replicate"):
        comm = sum(c for (_, g), (_, c, _) in want.items() if g == dim) / NS_PER_MS
        assert f"{dim} (groups " in note and f"{comm:,.1f} ms of communication" in note


def test_the_report_draws_the_view_for_several_groups_only(runs, tmp_path, capsys):
    assert group_blocks(analyze_trace(load_trace(runs["one"])).by_group, "one", "one") == []
    assert report.main([str(runs["two"]), "-o", str(tmp_path), "--no-timelines", "--no-cache"]) == 0
    capsys.readouterr()
    page = (tmp_path / "index.html").read_text()
    assert len(re.findall(r'"image":\s*"[^"]*_groups"', page)) == 1 and "per process group: replicate (groups" in page
