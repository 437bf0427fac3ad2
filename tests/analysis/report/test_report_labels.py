"""Runs that share an implementation and a file name (a/fsdp.sqlite, b/fsdp.sqlite) stay apart on every
page: each is labelled with as much of its folder as tells it from the other, in the summary, every
chart, the side-by-side page, its own timeline page and the timeline CLI's panels."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from analysis.report import command as report
from analysis.run.run_files import RunFiles, distinct_names, shown_files, unique_tails
from analysis.timeline import command as timeline
from tests.analysis.render.test_figure_dicts import page_figures
from tests.support.synthetic_ddp import write_ddp_trace


@pytest.fixture(scope="module")
def twins(tmp_path_factory):
    """One trace copied under two folders with the same file name (fp32 and bf16 runs of one implementation)."""
    root = tmp_path_factory.mktemp("twins")
    (root / "a").mkdir()
    (root / "b").mkdir()
    first = write_ddp_trace(root / "a" / "fsdp.sqlite", n_kernels=4_000, n_ranks=2, n_steps=4, implementation="fsdp")
    shutil.copy(first, root / "b" / "fsdp.sqlite")
    return root, [root / "a" / "fsdp.sqlite", root / "b" / "fsdp.sqlite"]


def test_unique_tails_take_only_the_folders_needed():
    assert unique_tails([("x", "a", "fsdp"), ("x", "b", "fsdp"), ("x", "a", "naive")]) == ["a/fsdp", "b/fsdp", "naive"]
    assert unique_tails([("a", "c", "f"), ("b", "c", "f")]) == ["a/c/f", "b/c/f"]
    assert shown_files(["a/fsdp.sqlite", "b/fsdp.sqlite", "naive.sqlite"]) == [
        "a/fsdp.sqlite",
        "b/fsdp.sqlite",
        "naive.sqlite",
    ]
    runs = [RunFiles("fsdp", (Path("/r/a/fsdp.sqlite"),)), RunFiles("fsdp", (Path("/r/b/fsdp.sqlite"),))]
    assert distinct_names(runs) == ["a/fsdp", "b/fsdp"]


def _text(fig: dict) -> str:
    return json.dumps(fig)


@pytest.mark.pages  # writes a whole report with its timelines
def test_a_report_keeps_two_runs_of_one_name_apart_everywhere(twins, tmp_path, capsys):
    _, paths = twins
    out = tmp_path / "r"
    assert report.main([*map(str, paths), "-o", str(out), "--format", "json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert sorted(r["trace"] for r in summary) == sorted(map(str, paths))
    labels = ["fsdp (a/fsdp)", "fsdp (b/fsdp)"]
    figures = page_figures((out / "index.html").read_text())
    bars = [t for f in figures for t in f["data"] if t.get("type") == "bar" and isinstance(t.get("x"), list)]
    by_run = [t for t in bars if all(str(x).startswith("fsdp") for x in t["x"])]  # the stacked step breakdown
    assert len(by_run) >= 4 and all(sorted(t["x"]) == labels for t in by_run)  # two bars, not one
    boxes = [t for f in figures for t in f["data"] if t.get("type") == "box"]
    assert sorted(t["name"] for t in boxes) == labels  # one box per run, not one for both
    side = page_figures((out / "timelines" / "side_by_side.html").read_text())
    assert len(side) == 1
    for label in labels:  # both panels, each once
        # the panel titles drawn (the drop-downs' buttons carry the other steps' titles)
        drawn = _text({"annotations": side[0]["layout"].get("annotations", [])})
        assert drawn.count(f"<b>{label}</b>") == 1, label
    pages = sorted((out / "timelines").glob("fsdp*.html"))
    titles = [p.read_text().split("<title>")[1].split("</title>")[0] for p in pages]
    assert sorted(titles) == [f"Timeline: {x}" for x in labels]
    shown = {page: _text(page_figures(page.read_text())[0]["layout"]) for page in pages}
    assert sorted("a/fsdp.sqlite" in t for t in shown.values()) == [False, True]
    assert sorted("b/fsdp.sqlite" in t for t in shown.values()) == [False, True]


def test_timeline_panels_of_two_runs_of_one_name_are_told_apart(twins, tmp_path, capsys):
    _, paths = twins
    page = tmp_path / "t.html"
    assert timeline.main([*map(str, paths), "-o", str(page)]) == 0
    layout = _text(page_figures(page.read_text())[0]["layout"])
    assert layout.count("a/fsdp.sqlite") == 1 and layout.count("b/fsdp.sqlite") == 1
