"""The Python API the CLIs are thin over (analysis.open_runs): one run read once, asked for its
overlap per rank and step, its collectives and its timeline, with the figures the CLIs print."""

from __future__ import annotations

import json

import pytest

from analysis import open_runs
from analysis.overlap import command as overlap
from analysis.run import loaded_run as runs_module
from analysis.timeline import command as timeline
from tests.support.synthetic_ddp import write_rank_files

T0 = 1_700_000_000_000_000_000


@pytest.fixture(scope="module")
def rank_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("api")
    return write_rank_files(d, "naive", [2_000, 2_000], n_steps=3, t0=T0, implementation="naive")


def test_one_open_serves_overlap_collectives_and_timeline_from_one_read(rank_files, tmp_path, capsys, monkeypatch):
    reads: list[str] = []
    real = runs_module.read_trace

    def counted(paths, patterns=None, **how):
        reads.extend(str(p) for p in paths)
        return real(paths, patterns, **how)

    monkeypatch.setattr(runs_module, "read_trace", counted)
    runs = open_runs(rank_files)  # <run>.rank<N> files: one run
    steps = runs.overlap().steps
    assert sorted(set(zip(steps["rank"], steps["step"], strict=True))) == [(r, s) for r in (0, 1) for s in range(3)]
    by_rank = runs.collectives().by_rank
    assert sorted(by_rank["rank"]) == [0, 1]
    page = runs.timeline(tmp_path / "t.html", step=1)
    assert page.path.is_file() and [p.ranks for p in page.panels] == [2] and page.notes == [""]
    assert sorted(reads) == sorted(map(str, rank_files))  # each file read once for all three

    # the CLIs print the same figures
    assert overlap.main([*map(str, rank_files), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["traces"][0]["summary"]["step_ms"] == pytest.approx(runs.overlap().summary["step_ms"].iloc[0])
    assert (
        timeline.main([*map(str, rank_files), "--step", "1", "-o", str(tmp_path / "c.html"), "--format", "json"]) == 0
    )
    (row,) = json.loads(capsys.readouterr().out)
    assert row["segments"] == page.panels[0].segments


def test_the_api_takes_the_options_the_clis_take(rank_files):
    """open_runs/analyze take an AnalysisOptions (analysis/options.py) as the CLIs build it, the same
    runs and figures as the keyword form; options given both ways are refused."""
    from analysis import analyze
    from analysis.options import AnalysisOptions

    paths = [str(p) for p in rank_files]
    options = AnalysisOptions(paths, skip_steps=1, step=2, rank=1)
    by_options = analyze(paths, options).steps
    by_keywords = open_runs(paths, skip_steps=1).overlap(step=2, rank=1).steps
    assert len(by_options) == 1 and by_options.equals(by_keywords)
    assert open_runs(paths, options).runs == open_runs(paths).runs
    assert open_runs(paths, options).options.skip_steps == 1 and open_runs(paths, options).options == options
    with pytest.raises(TypeError, match="skip_steps"):
        open_runs(paths, options, skip_steps=2)
