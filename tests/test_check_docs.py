"""scripts/check_docs.py: which command each quoted output belongs to, the comparison of quoted figures
(excerpts, moved columns, tolerance), one line per block and exit 1 on a difference."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture()
def check_docs(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("check_docs", ROOT / "scripts" / "check_docs.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "check_docs", module)  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "ROOT", tmp_path)  # pages and commands relative to a folder of our own
    return module


PAGE = """# A page

```bash
python -m analysis.overlap a.sqlite
```

prose between

```
 rank  step ms
    0   10.000
```

```bash
python -m analysis.overlap a.sqlite
python -m analysis.report a.sqlite
```

```
two commands: which one?
```

<!-- check: echo 'total 1.500 ms'; echo 'rank 0 7' -->
```
total 1.500 ms
...
```

<!-- check tol=5%: echo 'total 1.540 ms' -->
```
total 1.500 ms
```

<!-- check: echo 'b 2' -->
```
b 3
```

<!-- check: skip needs a GPU -->
```
gpu 1
```

```
$ echo 'a 1'
a 1
$ echo 'b 2'
b 3
```
"""


def test_each_output_block_gets_its_command_or_a_reason(check_docs, tmp_path):
    (tmp_path / "p.md").write_text(PAGE)
    checks = check_docs.page_checks("p.md")
    assert [(c.command, c.why.split(":")[0]) for c in checks] == [
        ("python -m analysis.overlap a.sqlite", ""),
        (None, "several commands before it"),
        ("echo 'total 1.500 ms'; echo 'rank 0 7'", ""),
        ("echo 'total 1.540 ms'", ""),
        ("echo 'b 2'", ""),
        (None, "needs a GPU"),
        ("echo 'a 1'", ""),
        ("echo 'b 2'", ""),
    ]
    assert checks[3].tol == pytest.approx(0.05) and checks[7].quoted == ["b 3"] and checks[6].quoted == ["a 1"]


def test_quoted_lines_match_in_order_with_figures_within_tolerance(check_docs):
    printed = ["[x] progress", " rank   step ms   comm ms", "    0    10.000     2.000", "note: done"]
    assert check_docs.compare([" rank step ms comm ms", "0 10.000 2.000"], printed, 0.001) == ""  # spacing moved
    assert check_docs.compare(["...", "note: done"], printed, 0.001) == ""  # an excerpt
    assert "quoted `0 10.100 2.000`" in check_docs.compare(["0 10.100 2.000"], printed, 0.001)
    assert check_docs.compare(["0 10.100 2.000"], printed, 0.02) == ""
    assert "no line of that shape" in check_docs.compare(["0 10.000 2.000 5"], printed, 0.001)  # a column more
    long = ["note: clocks: rank 1: session clock kept; offset 23.298082 ms, estimate 23.297556 ms over 1096"]
    printed_long = ["note: clocks: rank 1: session clock kept; offset 23.298082 ms, estimate 23.298065 ms over 1096"]
    assert check_docs.compare(long, printed_long, 0.000001).endswith("figure 3 is 23.297556, printed 23.298065")
    assert check_docs.compare(["note: done", " rank step ms comm ms"], printed, 0.001) != ""  # out of order


def test_one_line_per_block_and_exit_1_on_a_difference(check_docs, tmp_path, capsys):
    (tmp_path / "p.md").write_text(PAGE)
    code = check_docs.main(["p.md"])
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == ["SKIP", "SKIP", "OK", "OK", "DIFF", "SKIP", "SKIP", "SKIP"]
    assert "input not here: a.sqlite" in lines[0] and "quoted `b 3`, printed `b 2`" in lines[4]
    assert "not an analysis command" in lines[-1]  # `$ echo` unmarked: only analysis commands run unasked
    assert code == 1


@pytest.mark.real
@pytest.mark.skipif(not (ROOT.parent / "shared" / "data").is_dir(), reason="../shared/data is absent")
def test_the_pages_quote_what_their_commands_print_now():
    """The real tree: every checked block of README.md and docs/ matches its command's output today."""
    import subprocess

    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "check_docs.py")], cwd=ROOT, capture_output=True, text=True, timeout=900
    )
    lines = done.stdout.splitlines()
    assert done.returncode == 0, "\n".join(line for line in lines if line.startswith("DIFF")) or done.stderr
    assert sum(line.startswith("OK") for line in lines) >= 8, done.stdout


def test_a_command_quoted_on_several_pages_runs_once(check_docs, tmp_path, capsys):
    block = "<!-- check: echo ran >> ran.txt; wc -l < ran.txt -->\n```\n1\n```\n"
    (tmp_path / "p.md").write_text(block)
    (tmp_path / "q.md").write_text(f"# another page\n\n{block}")
    assert check_docs.main(["p.md", "q.md"]) == 0, capsys.readouterr().out
    assert (tmp_path / "ran.txt").read_text() == "ran\n"
