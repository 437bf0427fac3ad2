"""examples/: the shipped GPU exports load from a clean copy as they are (.xz), and a slimmed export prints
what its original prints, byte for byte, in every analysis CLI (the original from ../shared/data)."""

from __future__ import annotations

import lzma
import re
import shutil
from pathlib import Path

import pytest

from analysis.advise.command import main as advise
from analysis.collectives.command import main as collectives
from analysis.overlap.command import main as overlap
from analysis.report.command import main as report
from analysis.run.loaded_run import load_trace
from analysis.timeline.command import main as timeline
from tests import gpu_traces

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
SHIPPED = {
    "h100/naive.sqlite.xz": "naive",
    "h100/flat.sqlite.xz": "flat",
    "h100/overlap.sqlite.xz": "overlap",
    "h100/overlap_bucket.sqlite.xz": "overlap_bucket",
    "h100/torch.sqlite.xz": "torch",
    "h200/fsdp_bf16.sqlite.xz": "fsdp",
    "h200/torch.sqlite.xz": "torch",
}


def tree(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def test_examples_hold_the_shipped_exports_and_no_more_than_10_mb() -> None:
    found = sorted(str(p.relative_to(EXAMPLES)) for p in EXAMPLES.rglob("*.xz"))
    assert found == sorted(SHIPPED)
    assert sum((EXAMPLES / f).stat().st_size for f in found) < 10e6


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_an_example_loads_from_a_clean_copy(name, tmp_path) -> None:
    copy = tmp_path / "examples"
    shutil.copytree(EXAMPLES, copy, ignore=shutil.ignore_patterns(".*"))  # a fresh clone has no cache folders
    before = tree(copy)
    trace = load_trace(copy / name, cache=False)
    assert trace.implementation == SHIPPED[name]
    assert sorted(trace.ranks["rank"]) == [0, 1]
    assert tree(copy) == before  # read as it is: nothing decompressed beside it


def cli_outputs(folder: Path, name: str, monkeypatch, capsys) -> dict[str, str]:
    """stdout of every analysis CLI on `folder/name` (run from the folder, relative paths), and the files
    the timeline and the report write."""
    monkeypatch.chdir(folder)
    runs = {
        "overlap": lambda: overlap([name, "--per-step"]),
        "overlap.json": lambda: overlap([name, "--format", "json"]),
        "collectives": lambda: collectives([name, "--summary"]),
        "collectives.csv": lambda: collectives([name, "--format", "csv"]),
        "timeline": lambda: timeline([name, "-o", "t.html"]),
        "report": lambda: report([name, "-o", "r"]),
        "advise": lambda: advise([name]),
    }
    out = {}
    for label, run in runs.items():
        status = run()
        out[label] = f"{capsys.readouterr().out}exit {status}"
    out["t.html"] = (folder / "t.html").read_text()
    for page in sorted((folder / "r").rglob("*.html")):
        out[str(page.relative_to(folder))] = page.read_text()
    # summary.csv names each input by its sha256, which a slimmed file cannot share
    out["summary.csv"] = re.sub(r"[0-9a-f]{64}", "SHA", (folder / "r" / "summary.csv").read_text())
    return out


@pytest.mark.real  # two real exports through every CLI, pages included
@pytest.mark.pages
def test_a_slimmed_example_prints_what_its_original_prints(tmp_path, monkeypatch, capsys) -> None:
    if not gpu_traces.available():
        pytest.skip("../shared/data/gpu_h100 not present")
    monkeypatch.setenv("ANALYSIS_NO_CACHE", "1")
    (tmp_path / "original").mkdir()
    (tmp_path / "slim").mkdir()
    with lzma.open(gpu_traces.GPU_H100 / "torch.sqlite.xz") as src:
        (tmp_path / "original" / "torch.sqlite").write_bytes(src.read())
    with lzma.open(EXAMPLES / "h100" / "torch.sqlite.xz") as src:
        (tmp_path / "slim" / "torch.sqlite").write_bytes(src.read())
    assert (tmp_path / "slim" / "torch.sqlite").stat().st_size < (tmp_path / "original" / "torch.sqlite").stat().st_size
    original = cli_outputs(tmp_path / "original", "torch.sqlite", monkeypatch, capsys)
    slim = cli_outputs(tmp_path / "slim", "torch.sqlite", monkeypatch, capsys)
    assert original.keys() == slim.keys()
    for label in original:
        assert slim[label] == original[label], label
