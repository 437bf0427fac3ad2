"""Every CLI takes the same pattern options and turns bad input into one line and exit code 2."""

from __future__ import annotations

import json

import pytest

from analysis.collectives import command as collectives
from analysis.overlap import command as overlap
from analysis.report import command as report
from analysis.timeline import command as timeline
from tests.support.synthetic_ddp import write_ddp_trace

CLIS = {
    "overlap": (overlap.main, []),
    "timeline": (timeline.main, ["-o", "{tmp}/t.html"]),
    "report": (report.main, ["-o", "{tmp}/r"]),
    "collectives": (collectives.main, []),
}


@pytest.fixture(scope="module")
def ddp_trace(tmp_path_factory):
    return write_ddp_trace(tmp_path_factory.mktemp("cli") / "ddp.sqlite", n_kernels=4_000, n_ranks=2, n_steps=3)


@pytest.mark.parametrize("name", list(CLIS))
def test_a_bad_pattern_is_one_line_and_exit_2_on_every_cli(name, ddp_trace, tmp_path, capsys):
    main, extra = CLIS[name]
    code = main([str(ddp_trace), *[a.format(tmp=tmp_path) for a in extra], "--comm-pattern", "(nccl"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "not a valid regular expression" in err and "Traceback" not in err


def test_timeline_and_overlap_agree_under_the_same_comm_pattern(ddp_trace, tmp_path, capsys):
    """A pattern that names no kernel leaves no kernel communication: both CLIs say so alike."""
    figures = {}
    for pattern in ("(?i)^nccl", "^no_such_kernel$"):
        assert overlap.main([str(ddp_trace), "--format", "json", "--comm-pattern", pattern]) == 0
        summary = json.loads(capsys.readouterr().out)["traces"][0]["summary"]
        assert (
            timeline.main(
                [str(ddp_trace), "-o", str(tmp_path / "t.html"), "--format", "json", "--comm-pattern", pattern]
            )
            == 0
        )
        whole = json.loads(capsys.readouterr().out)[0]["whole_run"]  # the row itself is the step the page opens on
        assert whole["comm_ms"] == pytest.approx(summary["comm_ms"])
        assert whole["step_ms"] == pytest.approx(summary["step_ms"])
        figures[pattern] = summary["comm_ms"]
    assert figures["(?i)^nccl"] > 0 and figures["(?i)^nccl"] != figures["^no_such_kernel$"]


@pytest.mark.parametrize("named, chosen", [(None, "system"), ("mimalloc", "mimalloc")])
def test_a_command_process_chooses_the_system_allocator_unless_one_is_named(named, chosen, monkeypatch, tmp_path):
    """exit_process (the `python -m analysis.<command>` entries) sets Arrow's pool for its own process only,
    before the command's module is imported."""
    import os
    import sys

    from analysis.cli import exit_process

    (tmp_path / "pool_probe.py").write_text(
        "import os\nSEEN = os.environ['ARROW_DEFAULT_MEMORY_POOL']\n"
        f"def main():\n    return 3 if SEEN == {chosen!r} else 1\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "pool_probe", raising=False)
    monkeypatch.delenv("ARROW_DEFAULT_MEMORY_POOL", raising=False)
    if named is not None:
        monkeypatch.setenv("ARROW_DEFAULT_MEMORY_POOL", named)
    with pytest.raises(SystemExit) as ended:
        exit_process("pool_probe")
    assert ended.value.code == 3
    assert os.environ["ARROW_DEFAULT_MEMORY_POOL"] == chosen
