"""The table CLIs run without plotly: `analysis.overlap`, `analysis.collectives` (no chart flag) and
`analysis.advise` print exactly what they print with it when plotly and kaleido cannot be imported
(a sitecustomize on PYTHONPATH puts a finder refusing them first on sys.meta_path, in every process
the command starts, pool workers included)."""

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.progress import without_progress
from tests.support.synthetic_ddp import write_ddp_trace
from tests.support.synthetic_kineto import write_kineto_ddp_trace

REPO = Path(__file__).resolve().parents[2]
BLOCKER = """import sys

class NoCharts:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("plotly", "kaleido", "_plotly_utils"):
            raise ImportError(f"{name} is made unimportable by the test")
        return None

sys.meta_path.insert(0, NoCharts())
"""


def run(args: list[str], site: Path | None = None) -> subprocess.CompletedProcess:
    """`python -m ARGS` from the repository, with the chart blocker's folder on PYTHONPATH when `site`."""
    env = dict(os.environ)
    if site is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")]))
    cmd = [sys.executable, "-m", *args]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    d = tmp_path_factory.mktemp("no_plotly")
    site = d / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCKER)
    nsys = write_ddp_trace(d / "overlap.sqlite", 600, 2, 3, 2, implementation="overlap")
    kineto = write_kineto_ddp_trace(d / "k", 600, 2, 3, 2)
    return site, nsys, kineto


def test_the_blocker_refuses_plotly(traces):
    site, _, _ = traces
    done = run(["plotly", "--version"], site)
    assert done.returncode != 0 and "made unimportable by the test" in done.stderr


@pytest.mark.subprocess
@pytest.mark.parametrize(
    "command",
    [
        ["analysis.overlap", "{nsys}"],
        ["analysis.overlap", "{nsys}", "--format", "json"],
        ["analysis.overlap", "{kineto}"],
        ["analysis.overlap", "{nsys}", "--jobs", "2", "--format", "csv"],
        ["analysis.collectives", "{nsys}"],
        ["analysis.collectives", "{kineto}", "--summary"],
        ["analysis.advise", "{nsys}"],
    ],
    ids=lambda c: " ".join(c),
)
def test_a_table_cli_prints_the_same_without_plotly(traces, command, capsys):
    """The command without plotly in a fresh process prints what its main prints here, where plotly is loaded."""
    site, nsys, kineto = traces
    files = {"{nsys}": [str(nsys)], "{kineto}": [str(p) for p in kineto]}  # the Kineto run: one file per rank
    module, *args = [f for a in command for f in files.get(a, [a])]
    capsys.readouterr()
    code = importlib.import_module(f"{module}.command").main(args)
    normal = capsys.readouterr()
    without = run([module, *args], site)
    assert code == 0, normal.err
    assert (without.returncode, without.stdout) == (0, normal.out)
    assert without_progress(without.stderr) == without_progress(normal.err)
