"""`python -m analysis.report`: index page, summary.csv, results.db history, safety of the -o folder."""

from __future__ import annotations

import csv
import json
import shutil
import sqlite3

import pandas as pd
import pytest
from plotly.offline import get_plotlyjs

from analysis.overlap.analyze import analyze_trace
from analysis.render.html_page import PLOTLY_FILE
from analysis.report import command as report, report_files
from analysis.report.html_report import breakdown
from analysis.run.loaded_run import load_trace
from analysis.timeline.representative import representative_step
from tests.analysis.timeline.test_timeline_traces import write_trace


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    folder = tmp_path_factory.mktemp("report_traces")
    return [write_trace(folder / f"{k}.sqlite", k) for k in ("naive", "overlap")]


def run(capsys, *argv) -> tuple[int, str, str]:
    code = report.main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.pages  # writes whole reports (pages and timelines), some twice
def test_report_writes_every_output_inside_the_folder(traces, tmp_path, capsys):
    out = tmp_path / "reports"
    before = sorted(p.name for p in tmp_path.iterdir())
    code, stdout, err = run(capsys, *traces, "-o", out, "--format", "json")
    assert code == 0, err
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*before, "reports"])
    written = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert written == [
        "index.html",
        PLOTLY_FILE,
        "results.db",
        "summary.csv",
        "timelines/naive.html",
        "timelines/overlap.html",
        "timelines/side_by_side.html",
    ]
    rows = json.loads(stdout)
    assert {r["implementation"]: r["overlap_pct"] for r in rows} == {
        "naive": 0.0,
        "overlap": pytest.approx(43.936, abs=1e-3),
    }
    assert all(r["speedup_vs_naive"] == pytest.approx(1.0) for r in rows)
    notes = {r["implementation"]: r["notes"] for r in rows}  # design notes (trace/run_info.py)
    assert len(notes["naive"]) == 1 and "after backward" in notes["naive"][0] and notes["overlap"] == []
    index = (out / "index.html").read_text()
    assert get_plotlyjs() not in index and f'src="{PLOTLY_FILE}"' in index  # plotly.js once for the folder
    assert f'src="../{PLOTLY_FILE}"' in (out / "timelines/naive.html").read_text()
    assert 'href="timelines/side_by_side.html"' in index and 'href="timelines/overlap.html"' in index
    for heading in ("step ms", "comm ms", "exposed comm ms", "overlap %", "speedup over naive"):
        assert f"<th>{heading}</th>" in index
    side = (out / "timelines/side_by_side.html").read_text()
    for trace in traces:  # each panel: the step the timelines open on (the representative step), the rule said
        step, rank = representative_step(analyze_trace(load_trace([trace])).steps)
        assert f"step {step}, rank {rank}: step " in side
        assert f"Call by call: step {step}, rank {rank}, the step closest to the run&#x27;s medians" in index
    assert "Each panel shows the step closest to the run&#x27;s medians" in side
    said = "naive: naive all-reduces each gradient after backward, one blocking call at a time: no overlap"
    for page in (index, side, (out / "timelines/naive.html").read_text()):  # the design note beside the figures
        assert said in page
    assert said not in (out / "timelines/overlap.html").read_text()


def test_summary_csv_matches_the_analysis(traces, tmp_path, capsys):
    assert run(capsys, *traces, "-o", tmp_path, "--no-timelines")[0] == 0
    with open(tmp_path / "summary.csv") as f:
        rows = {r["implementation"]: r for r in csv.DictReader(f)}
    assert float(rows["naive"]["exposed_comm_ms"]) == pytest.approx(8.95)
    assert float(rows["overlap"]["overlap_ms"]) == pytest.approx(9.6)
    assert len(rows["naive"]["sha256"]) == 64 and not (tmp_path / "timelines").exists()


def test_breakdown_parts_add_up_to_the_step():
    summary = pd.DataFrame(
        {"label": ["a"], "step_ms": [100.0], "compute_ms": [60.0], "overlap_ms": [15.0], "exposed_comm_ms": [10.0]}
    )
    parts = breakdown(summary).iloc[0]
    parts_ms = (parts["compute_only_ms"], parts["overlap_ms"], parts["exposed_comm_ms"], parts["idle_ms"])
    assert parts_ms == (45, 15, 10, 30)


@pytest.mark.pages  # writes whole reports (pages and timelines), some twice
def test_results_db_accumulates_history_without_duplicates(traces, tmp_path, capsys):
    copy = tmp_path / "naive.sqlite"
    shutil.copy(traces[0], copy)
    out = tmp_path / "rep"
    for _ in range(2):
        assert run(capsys, copy, traces[1], "-o", out, "--no-timelines")[0] == 0
    db = sqlite3.connect(out / "results.db")
    count = lambda table: db.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
    assert (count("traces"), count("ranks"), count("steps")) == (2, 4, 12)
    write_trace(copy, "naive", steps=4)  # same path, new content: a new history entry
    assert run(capsys, copy, traces[1], "-o", out, "--no-timelines")[0] == 0
    assert (count("traces"), count("ranks"), count("steps")) == (3, 6, 12 + 8)
    hashes = db.execute("SELECT count(DISTINCT sha256) FROM traces WHERE path = ?", (str(copy),)).fetchone()[0]
    assert hashes == 2
    cols = {r[1] for r in db.execute("PRAGMA table_info(steps)")}
    assert {"path", "sha256", "rank", "step", "overlap_ms", "exposed_comm_ms"} <= cols


@pytest.mark.pages  # writes whole reports (pages and timelines), some twice
def test_per_rank_files_are_one_trace(traces, tmp_path, capsys):
    files = [write_trace(tmp_path / f"naive.rank{r}.sqlite", "naive", ranks=1, first_rank=r) for r in (0, 1)]
    out = tmp_path / "rep"
    code, stdout, err = run(capsys, *files, traces[1], "-o", out, "--format", "json")
    assert code == 0, err
    rows = json.loads(stdout)
    assert sorted((r["implementation"], r["ranks"]) for r in rows) == [("naive", 2), ("overlap", 2)]
    assert (out / "timelines" / "naive.html").exists() and (out / "timelines" / "side_by_side.html").exists()


def test_refuses_to_overwrite_files_it_did_not_write(traces, tmp_path, capsys):
    (tmp_path / "index.html").write_text("<html>my own notes</html>")
    code, _, err = run(capsys, *traces, "-o", tmp_path)
    assert code == 2 and "refusing to overwrite" in err and len(err.strip().splitlines()) == 1
    assert (tmp_path / "index.html").read_text() == "<html>my own notes</html>"
    assert not (tmp_path / "summary.csv").exists()
    (tmp_path / "index.html").unlink()
    (tmp_path / "summary.csv").write_text("a,b\n1,2\n")
    code, _, err = run(capsys, *traces, "-o", tmp_path)
    assert code == 2 and "summary.csv" in err and (tmp_path / "summary.csv").read_text() == "a,b\n1,2\n"


@pytest.mark.parametrize(
    "make_args, message",
    [
        (lambda t, d: [d / "missing.sqlite", "-o", d / "r"], "no such file"),
        (lambda t, d: [t[0], t[0], "-o", d / "r"], "given twice"),
        (lambda t, d: [t[0], "-o", t[1]], "is a file"),
    ],
)
def test_bad_input_exits_2_with_one_line(traces, tmp_path, capsys, make_args, message):
    code, _, err = run(capsys, *make_args(traces, tmp_path))
    assert code == 2 and message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "r").exists()


def _error_lines(err: str) -> list[str]:
    """stderr without the [report] progress lines."""
    return [line for line in err.splitlines() if not line.startswith("[report] ")]


def test_a_foreign_side_by_side_page_is_refused_before_anything_is_written(traces, tmp_path, capsys):
    (tmp_path / "timelines").mkdir()
    (tmp_path / "timelines" / "side_by_side.html").write_text("<html>mine</html>")
    code, _, err = run(capsys, *traces, "-o", tmp_path)
    assert code == 2 and "side_by_side.html" in err and "refusing to overwrite" in err
    assert (tmp_path / "timelines" / "side_by_side.html").read_text() == "<html>mine</html>"
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["side_by_side.html", "timelines"]


def test_a_results_db_of_another_shape_is_one_error_and_nothing_else_is_written(traces, tmp_path, capsys):
    db = sqlite3.connect(tmp_path / "results.db")
    db.execute("CREATE TABLE steps (x TEXT)")
    db.commit()
    db.close()
    code, _, err = run(capsys, *traces, "-o", tmp_path)
    assert code == 2 and "results.db" in err and "steps" in err
    assert "Traceback" not in err and len(_error_lines(err)) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.db"]


def test_a_results_db_that_sqlite_refuses_is_one_error(traces, tmp_path, capsys, monkeypatch):
    def failing(*args, **kwargs):
        raise sqlite3.OperationalError("database is locked")

    monkeypatch.setattr(report_files, "_upsert_history", failing)
    code, _, err = run(capsys, *traces, "-o", tmp_path / "r")
    assert code == 2 and "database is locked" in err and len(_error_lines(err)) == 1
    assert not (tmp_path / "r" / "index.html").exists() and not (tmp_path / "r" / "summary.csv").exists()


def test_a_report_file_gets_the_export_command(traces, tmp_path, capsys):
    rep = tmp_path / "run.nsys-rep"
    rep.write_bytes(b"not really a report")
    code, _, err = run(capsys, rep, traces[1], "-o", tmp_path / "r")
    assert code == 2 and f"nsys export --type sqlite -o {tmp_path / 'run.sqlite'} {rep}" in err
    assert "--export" in err and len(_error_lines(err)) == 1 and not (tmp_path / "r").exists()


def test_call_chart_switches_to_every_step_of_its_rank_and_every_rank_of_its_step(tmp_path):
    """The per-call chart's drop-down lists the opened rank's steps, then the other ranks in the opened step;
    each choice shows that step's calls and titles them with that step's figures from the raw per-step rows."""
    from analysis import open_runs
    from analysis.report.report_collectives import CollectivesEntry, call_chart_rule, per_call_figure

    trace = write_trace(tmp_path / "overlap.sqlite", "overlap", ranks=3, steps=4)
    runs = open_runs([trace])
    steps = analyze_trace(load_trace([trace])).steps
    entry = CollectivesEntry("overlap", runs.loaded(0), runs.collectives(), steps)
    calls = entry.view.calls
    step, rank = representative_step(steps)
    fig = per_call_figure(entry)
    (menu,) = fig.layout.updatemenus
    expected = [(int(k), rank) for k in sorted(steps.loc[steps["rank"] == rank, "step"])]
    expected += [(step, int(r)) for r in sorted(steps["rank"].unique()) if r != rank]
    assert [b.label for b in menu.buttons] == [f"step {k}, rank {r}" for k, r in expected]
    assert menu.buttons[menu.active].label == f"step {step}, rank {rank}"  # it opens on the representative step
    assert [t.visible for t in fig.data] == list(menu.buttons[menu.active].args[0]["visible"])
    for button, (k, r) in zip(menu.buttons, expected, strict=True):
        row = steps.loc[(steps["step"] == k) & (steps["rank"] == r)].iloc[0]
        title = button.args[1]["title"]["text"]
        assert title.startswith(f"overlap: step {k}, rank {r}: {row['exposed_comm_ms']:.2f} ms of communication")
        assert f"step {row['step_ms']:.2f} ms" in title
        shown = [t for t, v in zip(fig.data, button.args[0]["visible"], strict=True) if v and t.type == "bar"]
        mine = calls.loc[(calls["step"] == k) & (calls["rank"] == r)]
        assert 0 < len(mine) <= 20  # every call on its own row: the bars are the calls' spans
        assert sum(float(sum(t.x)) for t in shown) == pytest.approx(float(mine["duration_ms"].sum()))
    assert f"every step of rank {rank} and every rank in step {step}" in call_chart_rule(entry)
