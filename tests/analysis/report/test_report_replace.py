"""A report folder written for other runs is never replaced silently: refused in one line naming what
is there (exit 2, nothing changed) unless --overwrite, which then removes the pages that report wrote
and this one does not, and nothing else; the same runs again, or more runs, replace it as before."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from analysis.report import command as report
from tests.support.synthetic_ddp import write_ddp_trace

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    folder = tmp_path_factory.mktemp("replace")
    return {
        impl: write_ddp_trace(folder / f"{impl}.sqlite", n_kernels=3_000, n_ranks=2, n_steps=3, implementation=impl)
        for impl in ("naive", "overlap", "flat")
    }


def run(capsys, *argv) -> tuple[int, str, str]:
    code = report.main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.pages  # writes whole reports with their timelines, three times
def test_a_report_of_other_runs_is_refused_then_replaced_only_when_asked(traces, tmp_path, capsys):
    out = tmp_path / "reports"
    assert run(capsys, traces["naive"], traces["overlap"], "-o", out)[0] == 0
    (out / "notes.txt").write_text("mine")  # the user's own files in the folder
    (out / "timelines" / "mine.html").write_text("<html>my page</html>")
    before = snapshot(out)
    code, stdout, err = run(capsys, traces["flat"], "-o", out)
    lines = [line for line in err.strip().splitlines() if not line.startswith("[")]
    assert code == 2 and stdout == "" and len(lines) == 1 and lines[0].startswith("error: "), err
    assert "holds the report of 2 runs" in lines[0] and str(traces["naive"]) in lines[0]
    assert "--overwrite" in lines[0] and "new -o" in lines[0]
    assert snapshot(out) == before  # nothing read, nothing written

    code, stdout, err = run(capsys, traces["flat"], "-o", out, "--overwrite")
    assert code == 0, err
    pages = sorted(p.name for p in (out / "timelines").iterdir())
    assert pages == ["flat.html", "mine.html"]  # the old runs' pages and side-by-side page gone, the user's kept
    assert (out / "notes.txt").read_text() == "mine" and (out / "timelines" / "mine.html").read_text() == before[
        "timelines/mine.html"
    ].decode()
    assert (
        "naive.sqlite" not in (out / "summary.csv").read_text() and "flat.sqlite" in (out / "summary.csv").read_text()
    )


def test_the_same_runs_or_more_replace_a_report_without_the_flag(traces, tmp_path, capsys):
    out = tmp_path / "reports"
    assert run(capsys, traces["naive"], "-o", out, "--no-timelines")[0] == 0
    assert run(capsys, traces["naive"], "-o", out, "--no-timelines")[0] == 0  # the same run again
    assert run(capsys, traces["naive"], traces["flat"], "-o", out, "--no-timelines")[0] == 0  # one more: nothing lost
    code, _, err = run(capsys, traces["flat"], "-o", out, "--no-timelines")  # naive would be lost
    assert code == 2 and "holds the report of 2 runs" in err and "naive.sqlite" in err


def test_run_sh_replaces_its_own_report_folder():
    """run.sh writes reports/ on every run, whatever it recorded before: it passes --overwrite, and the
    report CLI takes the flag."""
    calls = [line for line in (REPO / "run.sh").read_text().splitlines() if "-m analysis.report" in line]
    assert len(calls) == 1
    argv = shlex.split(re.sub(r"#.*", "", calls[0]).replace('"$PY" -m analysis.report', ""))
    assert "--overwrite" in argv and argv[argv.index("-o") + 1] == "reports/"
    assert report.parse_args(["t.sqlite", "-o", "reports/", "--overwrite"]).overwrite
