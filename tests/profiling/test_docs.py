"""docs/profiling.md and the docs' commands against what the code does now: the implementations `all`
records, every run_nsys.sh option, and every output a documented command writes into the checkout
being ignored by git."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from ddp.strategies.registry import IMPLEMENTATIONS
from tests.profiling.test_nsys import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
OUTPUT_FLAG = re.compile(r"(?:^|\s)(?:-o|--out-dir|--output|--csv|--prefetch-chart)[ =](\S+)")


def commands(page: Path) -> list[str]:
    """The command lines in `page`'s fenced code blocks (a `$ ` prompt dropped)."""
    blocks = re.findall(r"```[a-z]*\n(.*?)```", page.read_text(), re.S)
    lines = (line.strip().removeprefix("$ ") for block in blocks for line in block.splitlines())
    return [line for line in lines if re.match(r"(python3? |bash |nsys |\.venv/)", line)]


def test_run_nsys_all_is_documented_as_every_registered_implementation():
    line = next(c for c in commands(REPO / "docs/profiling.md") if c.startswith("bash run_nsys.sh all "))
    listed = line.split("every implementation:", 1)[1].replace(" ", "").split(",")
    assert listed == list(IMPLEMENTATIONS)


def test_every_run_nsys_option_is_documented(capsys):
    """Its own options by name; the run settings (one per RunConfig field, a list that grows) by the
    sentence that sends the reader to RunConfig and --help."""
    from ddp.training.config import SETTINGS
    from profiling import record

    with pytest.raises(SystemExit):
        record.main(["--help"])
    heads = [line.strip().split("  ")[0] for line in capsys.readouterr().out.splitlines() if line.startswith("  -")]
    options = {o for head in heads for o in re.findall(r"--[a-z][a-z-]+", head)} - {"--help"}
    assert {"--steps", "--per-rank", "--dry-run"} <= options
    page = (REPO / "docs/profiling.md").read_text()
    own = options - {"--" + name.replace("_", "-") for name in SETTINGS}
    assert sorted(o for o in own if f"`{o}" not in page) == []
    assert "the other run settings of\n`ddp.training.config.RunConfig`" in page and "`--help` shows each" in page


@pytest.mark.skipif(shutil.which("git") is None or not (REPO / ".git").exists(), reason="not a git checkout")
def test_what_documented_commands_write_into_the_checkout_is_ignored_by_git():
    written = set()
    for page in PAGES:
        for cmd in commands(page):
            for path in OUTPUT_FLAG.findall(cmd):
                if path.startswith(("/", "$", "<")) or path.isupper():  # outside the checkout, or a placeholder
                    continue
                if cmd.startswith("nsys profile") and "." not in path:  # an nsys stem
                    path += ".nsys-rep"
                written.add(path + ("x.html" if path.endswith("/") else ""))
    assert {"reports/x.html", "prefetch/fsdp.html"} <= written  # the scan finds them
    res = subprocess.run(
        ["git", "check-ignore", "--no-index", *sorted(written)], cwd=REPO, capture_output=True, text=True
    )
    assert sorted(written - set(res.stdout.split())) == []
