"""`OpenRuns.report(folder)`: the library call writes what `python -m analysis.report` writes, from the
runs as loaded (one read per file), says what it wrote, and refuses a folder holding files not ours
before reading anything."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pandas as pd
import pytest

from analysis import TraceError, open_runs
from analysis.render.html_page import PLOTLY_FILE
from analysis.report import command as report
from analysis.report.ranked_runs import content_hash
from analysis.report.report_folder import ReportResult, RunsFailed
from analysis.run import loaded_run as runs_module
from tests.analysis.timeline.test_timeline_traces import write_trace


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    folder = tmp_path_factory.mktemp("report_folder_traces")
    return [write_trace(folder / f"{k}.sqlite", k) for k in ("naive", "overlap")]


@pytest.fixture
def reads(monkeypatch):
    """The paths read_trace is asked for while the test runs."""
    seen: list[str] = []
    real = runs_module.read_trace

    def counted(paths, patterns=None, **how):
        seen.extend(str(p) for p in paths)
        return real(paths, patterns, **how)

    monkeypatch.setattr(runs_module, "read_trace", counted)
    return seen


def files_of(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def history(db: Path) -> dict[str, list[tuple]]:
    """results.db's rows per table, without the time they were analysed at."""
    with sqlite3.connect(db) as con:
        out = {}
        for table in ("traces", "ranks", "steps"):
            frame = pd.read_sql(f"SELECT * FROM {table}", con).drop(columns=["analysed_at"], errors="ignore")
            out[table] = sorted(frame.astype(str).itertuples(index=False, name=None))
    return out


@pytest.mark.pages  # writes two whole reports
def test_the_library_writes_what_the_cli_writes(traces, tmp_path, capsys):
    by_cli, by_library = tmp_path / "cli", tmp_path / "library"
    assert report.main([*map(str, traces), "-o", str(by_cli)]) == 0
    capsys.readouterr()
    result = open_runs(traces).report(by_library)
    assert result.index == by_library / "index.html"
    assert files_of(by_library) == files_of(by_cli)
    for name in files_of(by_cli):
        if name.endswith((".html", ".js", ".csv")):  # pages, plotly.js and summary: byte for byte
            assert (by_library / name).read_bytes() == (by_cli / name).read_bytes(), name
    assert history(by_library / "results.db") == history(by_cli / "results.db")
    assert capsys.readouterr().err == ""  # the library prints nothing unless given `progress`


@pytest.mark.pages  # writes a whole report
def test_the_result_says_what_was_written(traces, tmp_path, reads):
    out = tmp_path / "r"
    lines: list[str] = []
    result = open_runs(traces).report(out, progress=lines.append)
    assert sorted(reads) == sorted(map(str, traces))  # one read per file: metrics, pages and collectives
    assert isinstance(result, ReportResult) and result.folder == out
    assert result.index == out / "index.html" and result.index.is_file()
    assert result.timelines == {str(t): out / "timelines" / f"{t.stem}.html" for t in traces}
    assert all(p.is_file() for p in result.timelines.values())
    assert result.side_by_side == out / "timelines" / "side_by_side.html" and result.side_by_side.is_file()
    assert result.plotly_js == out / PLOTLY_FILE and result.plotly_js.is_file()
    assert (result.summary_csv, result.results_db, result.images) == (out / "summary.csv", out / "results.db", ())
    on_disk = pd.read_csv(result.summary_csv)
    assert list(result.summary["implementation"]) == list(on_disk["implementation"])  # fastest first, as written
    assert list(result.summary["sha256"]) == [content_hash(Path(p)) for p in on_disk["trace"]]
    assert result.summary["step_ms"].tolist() == pytest.approx(on_disk["step_ms"].tolist())
    assert sorted(result.summary["label"]) == ["naive", "overlap"] and result.notes() == {}
    with sqlite3.connect(result.results_db) as con:
        assert len(result.steps) == con.execute("SELECT count(*) FROM steps").fetchone()[0]
    assert any(line.startswith("timeline of ") for line in lines) and lines[-1].startswith("wrote ")


def test_without_timelines_only_the_index_and_its_files_are_written(traces, tmp_path):
    result = open_runs(traces).report(tmp_path / "r", timelines=False, self_contained=True, step=1)
    assert files_of(tmp_path / "r") == ["index.html", "results.db", "summary.csv"]
    assert (result.timelines, result.side_by_side, result.plotly_js) == ({}, None, None)
    assert set(result.steps["step"]) == {1}


def test_a_folder_holding_files_not_ours_is_refused_before_any_read(traces, tmp_path, reads):
    (tmp_path / "index.html").write_text("<html>my own notes</html>")
    with pytest.raises(TraceError, match="refusing to overwrite"):
        open_runs(traces).report(tmp_path)
    assert reads == [] and (tmp_path / "index.html").read_text() == "<html>my own notes</html>"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["index.html"]


def test_bad_options_and_a_step_the_runs_lack_write_nothing(traces, tmp_path):
    runs = open_runs(traces)
    with pytest.raises(TraceError, match="--peak-busbw 0"):
        runs.report(tmp_path / "a", peak_busbw=0)
    with pytest.raises(TraceError, match="image format 'gif'"):
        runs.report(tmp_path / "b", images=["gif"])
    with pytest.raises(TraceError, match="--step 99"):
        runs.report(tmp_path / "c", step=99)
    assert list(tmp_path.iterdir()) == []


def test_a_run_that_fails_is_named_and_nothing_is_written(traces, tmp_path):
    bad = tmp_path / "bad.sqlite"
    bad.write_bytes(b"not a trace")
    with pytest.raises(RunsFailed, match=r"bad\.sqlite") as caught:
        open_runs([traces[0], bad]).report(tmp_path / "r")
    assert [r.error is not None for r in caught.value.results] == [False, True]
    assert not (tmp_path / "r").exists()


def test_the_gate_on_open_runs_says_what_the_cli_gate_says(traces, tmp_path, capsys, reads):
    """runs.compare(baseline): the same JSON as `analysis.report NEW --baseline OLD --format json`, the
    new run's figures from the load the report already made (one read of each file in all)."""
    import json

    rule = "exposed_comm_ms:+10%"
    code = report.main([str(traces[1]), "--baseline", str(traces[0]), "--fail-if", rule, "--format", "json"])
    by_cli = json.loads(capsys.readouterr().out)
    reads.clear()
    runs = open_runs([traces[1]])
    runs.report(tmp_path / "r", timelines=False)
    result = runs.compare([traces[0]], fail_if=[rule])
    assert sorted(reads) == sorted(map(str, traces))  # the new run once (report and gate), the baseline once
    assert result.to_json() == by_cli and code == (1 if result.failed else 0)
    assert result.verdict() == by_cli["verdict"]
    with pytest.raises(TraceError, match="both new and baseline"):
        runs.compare([traces[1]])
    with pytest.raises(TraceError, match="METRIC:LIMIT"):
        runs.compare([traces[0]], fail_if=["step_ms"])
    with pytest.raises(TraceError, match="one run; these paths are 2 runs"):
        open_runs(traces).compare([traces[0]])
