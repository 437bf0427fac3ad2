"""The Runs rule on every analysis CLI: files of different runs or the same rank twice are refused in
one line (exit 2), missing ranks are noted in every output format, a step, rank or warm-up skip the
input lacks is refused naming what it has, and one run's per-rank files are the same single run in
overlap, collectives, timeline and report."""

from __future__ import annotations

import csv
import io
import json

import pytest

from analysis.collectives import command as collectives
from analysis.errors import TraceError
from analysis.overlap import command as overlap
from analysis.report import command as report
from analysis.run import loaded_run as runs_module
from analysis.run.loaded_run import FileIdentity, check_one_run
from analysis.run.run_files import find_runs
from analysis.timeline import command as timeline
from tests.support.synthetic_ddp import write_ddp_trace, write_rank_files

CLIS = {
    "overlap": (overlap.main, []),
    "collectives": (collectives.main, []),
    "timeline": (timeline.main, ["-o", "{tmp}/t.html"]),
    "report": (report.main, ["-o", "{tmp}/r"]),
}
T0 = 1_700_000_000_000_000_000


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Two 2-rank runs recorded one file per rank (naive and overlap), and one more rank-0 file of naive."""
    d = tmp_path_factory.mktemp("runs")
    out = {}
    for impl in ("naive", "overlap"):
        written = write_rank_files(d, impl, [3_000, 3_000], n_steps=4, t0=T0, implementation=impl)
        out.update({f"{impl}{r}": path for r, path in enumerate(written)})
    (d / "again").mkdir()
    out["naive0_again"] = write_ddp_trace(
        d / "again" / "first.sqlite", n_kernels=3_000, n_ranks=1, n_steps=4, world_size=2, implementation="naive"
    )
    return out


def run(name, *args, tmp_path, capsys):
    main, extra = CLIS[name]
    code = main([*map(str, args), *[a.format(tmp=tmp_path) for a in extra]])
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(code, err):
    lines = [line for line in err.strip().splitlines() if not line.startswith("[")]  # progress lines aside
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize("name", list(CLIS))
def test_a_merge_of_two_runs_is_refused_naming_both(name, files, tmp_path, capsys):
    code, out, err = run(name, files["naive0"], files["overlap1"], "--merge", tmp_path=tmp_path, capsys=capsys)
    line = one_line_error(code, err)
    assert "naive.rank0.sqlite is run naive, 2 ranks" in line and "overlap.rank1.sqlite is run overlap" in line
    assert out == ""


@pytest.mark.parametrize("name", list(CLIS))
def test_the_same_rank_twice_is_refused(name, files, tmp_path, capsys):
    code, _, err = run(name, files["naive0"], files["naive0_again"], "--merge", tmp_path=tmp_path, capsys=capsys)
    line = one_line_error(code, err)
    assert "both hold rank 0" in line and "naive.rank0.sqlite" in line and "first.sqlite" in line


@pytest.mark.parametrize("fmt", ["table", "csv", "json"])
def test_missing_ranks_are_noted_in_every_format_of_overlap(fmt, files, tmp_path, capsys):
    code, out, _ = run("overlap", files["naive0"], "--format", fmt, tmp_path=tmp_path, capsys=capsys)
    assert code == 0
    note = "ranks 0 of 2: the run's other ranks are not in the input"
    if fmt == "json":
        assert json.loads(out)["traces"][0]["ranks_note"].startswith(note)
    elif fmt == "csv":
        assert all(row["ranks_note"].startswith(note) for row in csv.DictReader(io.StringIO(out)))
    else:
        assert f"note: {note}" in out


def test_missing_ranks_are_noted_by_collectives_timeline_and_report(files, tmp_path, capsys):
    code, out, _ = run("collectives", files["naive0"], "--format", "json", tmp_path=tmp_path, capsys=capsys)
    assert code == 0 and "1 of 2 ranks in this trace" in json.loads(out)["traces"][0]["note"]
    code, out, _ = run("timeline", files["naive0"], "--format", "json", tmp_path=tmp_path, capsys=capsys)
    assert code == 0 and json.loads(out)[0]["ranks_note"].startswith("ranks 0 of 2")
    code, out, _ = run("report", files["naive0"], "--format", "json", tmp_path=tmp_path, capsys=capsys)
    assert code == 0 and json.loads(out)[0]["ranks_note"].startswith("ranks 0 of 2")


@pytest.mark.parametrize("name", list(CLIS))
@pytest.mark.parametrize(
    "option, expected",
    [
        (["--step", "9"], "--step 9: the input has 4 steps (0-3)"),
        (["--rank", "5"], "--rank 5: the input has ranks 0, 1"),
        (["--skip-steps", "4"], "--skip-steps 4:"),
    ],
)
def test_a_step_rank_or_skip_beyond_the_input_is_refused_naming_what_it_has(
    name, option, expected, files, tmp_path, capsys
):
    code, _, err = run(name, files["naive0"], files["naive1"], *option, tmp_path=tmp_path, capsys=capsys)
    line = one_line_error(code, err)
    assert expected in line
    if option[0] == "--skip-steps":
        assert "4 steps (0-3) per rank" in line  # what is there


def test_per_rank_files_are_one_run_in_every_cli(files, tmp_path, capsys):
    pair = [files["naive0"], files["naive1"]]
    code, out, _ = run("overlap", *pair, "--format", "json", tmp_path=tmp_path, capsys=capsys)
    (trace,) = json.loads(out)["traces"]
    assert code == 0 and [r["rank"] for r in trace["ranks"]] == [0, 1] and trace["ranks_note"] == ""
    code, out, _ = run("collectives", *pair, "--format", "json", tmp_path=tmp_path, capsys=capsys)
    (facts,) = json.loads(out)["traces"]
    assert code == 0 and facts["ranks"] == 2 and facts["unpaired_calls"] == 0
    code, out, _ = run("timeline", *pair, "--format", "json", tmp_path=tmp_path, capsys=capsys)
    (row,) = json.loads(out)
    assert code == 0 and row["ranks"] == 2 and row["trace"].endswith("naive.rank*.sqlite (2 files)")
    code, out, _ = run("report", *pair, "--format", "json", tmp_path=tmp_path, capsys=capsys)
    (summary,) = json.loads(out)
    assert (
        code == 0
        and summary["implementation"] == "naive"
        and summary["step_ms"] == pytest.approx(trace["summary"]["step_ms"])
    )


def test_two_runs_with_one_name_get_a_trace_column(files, tmp_path, capsys):
    code, out, _ = run("overlap", files["naive0"], files["naive0_again"], tmp_path=tmp_path, capsys=capsys)
    assert code == 0
    header = out.splitlines()[0].split()
    assert header[:2] == ["trace", "implementation"] and "first.sqlite" in out and "naive.rank0.sqlite" in out


@pytest.mark.parametrize("name", ["report", "timeline", "collectives"])
def test_commands_that_need_the_events_read_each_file_once(name, files, tmp_path, capsys, monkeypatch):
    """Even where overlap would analyse the files in processes (default_jobs made 2 here), a command
    that draws or pairs the events reads each file once, in this process: no per-file tasks (whose
    reads a worker would make unseen here) and one read_trace per file, timelines and collectives
    included."""
    from analysis import session
    from analysis.parallel import pool

    reads: list[str] = []
    real = runs_module.read_trace

    def counted(paths, patterns=None, **how):
        reads.extend(str(p) for p in paths)
        return real(paths, patterns, **how)

    def no_tasks(*args, **kwargs):
        raise AssertionError("the files were analysed file by file")

    monkeypatch.setattr(runs_module, "read_trace", counted)
    monkeypatch.setattr(pool, "default_jobs", lambda paths: 2)
    monkeypatch.setattr(session, "analyze_groups", no_tasks)
    given = [files["naive0"], files["naive1"], files["overlap0"], files["overlap1"]]
    code, _, err = run(name, *given, tmp_path=tmp_path, capsys=capsys)
    assert code == 0, err
    assert sorted(reads) == sorted(map(str, given))


@pytest.mark.pool  # worker processes
def test_report_with_jobs_reads_each_file_in_a_task_and_once_more_here(files, tmp_path, capsys, monkeypatch):
    """--jobs 2 asks for per-file tasks: the metrics come from the workers, and the pages' events
    are read once more in this process (what the --jobs help says)."""
    reads: list[str] = []
    real = runs_module.read_trace

    def counted(paths, patterns=None, **how):
        reads.extend(str(p) for p in paths)
        return real(paths, patterns, **how)

    monkeypatch.setattr(runs_module, "read_trace", counted)
    given = [files["naive0"], files["naive1"]]
    code, _, err = run("report", *given, "--jobs", "2", tmp_path=tmp_path, capsys=capsys)
    assert code == 0, err
    assert sorted(reads) == sorted(map(str, given))  # the workers' reads are theirs


def test_find_runs_groups_rank_files_and_merge_takes_all():
    from pathlib import Path

    paths = [Path("a/x.rank0.sqlite"), Path("b/y.sqlite"), Path("a/x.rank1.sqlite")]
    found = find_runs(paths)
    assert [(r.name, [str(p) for p in r.paths]) for r in found] == [
        ("x", ["a/x.rank0.sqlite", "a/x.rank1.sqlite"]),
        ("y", ["b/y.sqlite"]),
    ]
    assert [len(r.paths) for r in find_runs(paths, merge=True)] == [3]
    with pytest.raises(TraceError, match="given twice"):
        find_runs([Path("a/x.sqlite"), Path("a/../a/x.sqlite")])


def test_check_one_run_says_nothing_about_files_that_record_nothing():
    check_one_run([FileIdentity("a", None, None, ()), FileIdentity("b", None, None, ())])
    check_one_run([FileIdentity("a", "naive", 2, (0,)), FileIdentity("b", None, None, (1,))])
    with pytest.raises(TraceError, match="a is run naive, 2 ranks; b is run naive, 4 ranks"):
        check_one_run([FileIdentity("a", "naive", 2, (0,)), FileIdentity("b", "naive", 4, (1,))])
