"""The analysis options are declared once (analysis/options.py): no CLI module declares a shared option
itself, every CLI that takes an option takes it with the same flag, metavar and default, and a bad value
is named the same way from the command line and from the API."""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

import pytest

import analysis
from analysis.advise import command as advise
from analysis.api import open_runs
from analysis.collectives import command as collectives
from analysis.errors import TraceError
from analysis.options import OPTIONS, AnalysisOptions
from analysis.overlap import command as overlap
from analysis.report import command as report
from analysis.timeline import command as timeline

ROOT = Path(analysis.__file__).parent
CLIS = {"overlap": overlap, "collectives": collectives, "timeline": timeline, "report": report, "advise": advise}
SHARED_FLAGS = {"--" + name.replace("_", "-") for name in OPTIONS if name != "paths"}


def _parsers() -> dict[str, argparse.ArgumentParser]:
    return {name: m.build_parser() for name, m in CLIS.items()}


def _declared_flags(path: Path) -> set[str]:
    """The option strings a module passes to add_argument itself (literal or f-string)."""
    flags = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
            for arg in node.args:
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    flags.add(arg.value)
                elif isinstance(arg, ast.JoinedStr):  # f"--{fmt}": a family of options
                    flags.add(ast.unparse(arg))
    return flags


def test_no_analysis_module_declares_a_shared_option_itself():
    modules = [p for p in ROOT.rglob("*.py") if p.name != "options.py"]
    assert len(modules) > 50  # the scan really walked the package
    own = {str(p.relative_to(ROOT)): _declared_flags(p) & SHARED_FLAGS for p in modules}
    assert {m: f for m, f in own.items() if f} == {}
    families = {str(p.relative_to(ROOT)): f for p in modules for f in _declared_flags(p) if f.startswith("f")}
    assert families == {}  # --png/--svg come from the declaration too


def test_every_cli_takes_a_shared_option_alike():
    seen: dict[str, dict[str, tuple]] = {}
    for cli_name, parser in _parsers().items():
        for action in parser._actions:
            flag = next((s for s in action.option_strings if s in SHARED_FLAGS), None)
            if flag:
                seen.setdefault(flag, {})[cli_name] = (
                    action.dest,
                    action.metavar,
                    action.default,
                    tuple(action.choices or ()),
                )
    assert seen["--format"].keys() == {"overlap", "collectives", "timeline", "report", "advise"}
    assert seen["--step"].keys() == {"overlap", "collectives", "timeline", "report"}
    assert seen["--png"].keys() == {"timeline", "report"}
    for flag, per_cli in seen.items():
        assert len(set(per_cli.values())) == 1, (flag, per_cli)


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"step": -1}, "--step -1: must be >= 0"),
        ({"rank": -3}, "--rank -3: must be >= 0"),
        ({"skip_steps": -1}, "--skip-steps -1: must be >= 0"),
        ({"jobs": 0}, "--jobs 0: must be a whole number >= 1"),
        ({"format": "xml"}, "--format xml: expected one of table, csv, json"),
    ],
)
def test_a_bad_value_is_named(given, message):
    with pytest.raises(TraceError) as e:
        AnalysisOptions(**given)
    assert str(e.value) == message


def test_the_api_and_the_command_line_refuse_alike(capsys):
    with pytest.raises(TraceError) as e:
        open_runs(["x.sqlite"], skip_steps=-2)
    assert overlap.main(["x.sqlite", "--skip-steps", "-2"]) == 2
    assert capsys.readouterr().err == f"error: {e.value}\n"


def test_options_from_a_command_line_keep_what_was_given():
    args = overlap.build_parser().parse_args(["a.sqlite", "b.sqlite", "--step", "3", "--format", "csv"])
    opts = AnalysisOptions.from_args(args)
    assert (list(opts.paths), opts.step, opts.rank, opts.format, opts.images) == (
        ["a.sqlite", "b.sqlite"],
        3,
        None,
        "csv",
        [],
    )
    assert opts.patterns.comm_kernel == OPTIONS["comm_pattern"].default
