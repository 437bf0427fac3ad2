"""Files of different runs are refused in one line naming both (exit 2), whatever the format: ranks of two
torch.profiler recordings (different step counts, run ids, or captured minutes apart), our rank 0 with a
plain PyTorch script's rank 1 (with the real script's: tests/analysis/test_plain_ddp_phases.py), on the
one-piece load and the per-file (--jobs) merge alike, and `report` writes nothing; one run's ranks still
merge."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from analysis.errors import TraceError
from analysis.overlap import command as overlap
from analysis.report import command as report
from analysis.run.run_files import FileIdentity, check_one_run
from tests.support.synthetic_kineto import write_kineto_ddp_trace

ROOT = Path(__file__).resolve().parents[3]


def rewrite(path: Path, **top: object) -> Path:
    """Set (or with None drop) top-level keys of a Kineto JSON file, as another recording would have them."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        doc = json.load(f)
    for key, value in top.items():
        if value is None:
            doc.pop(key, None)
        else:
            doc[key] = value
    with opener(path, "wt") as f:
        json.dump(doc, f)
    return path


def recording(folder: Path, name: str, steps: int, **meta: object) -> list[Path]:
    """A 2-rank run of our runner recorded with torch.profiler, `meta` added to each rank's ddp.meta."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = write_kineto_ddp_trace(folder / name, n_kernels=2_000, n_ranks=2, n_steps=steps)
    for p in paths:
        doc_meta = json.loads(p.read_text())["ddp.meta"]
        rewrite(p, **{"ddp.meta": {**doc_meta, "implementation": "overlap", "steps": steps, **meta}})
    return paths


def one_line(code: int, out: str, err: str) -> str:
    lines = [line for line in err.strip().splitlines() if not line.startswith("[")]
    assert code == 2 and out == "" and len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    return lines[0]


def merge(capsys, *paths: Path, jobs: int = 1) -> tuple[int, str, str]:
    code = overlap.main([*map(str, paths), "--merge", "--jobs", str(jobs), "--format", "json"])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("identity")
    out = {
        "ten": recording(root / "ten", "overlap", 10, run_id="aaaa"),
        "four": recording(root / "four", "overlap", 4, run_id="bbbb"),
        "other_id": recording(root / "other_id", "overlap", 10, run_id="cccc"),
        "no_id": recording(root / "no_id", "overlap", 10),
        "later": recording(root / "later", "overlap", 10),
    }
    for p in out["later"]:  # the same run shape recorded 154 s later
        rewrite(p, baseTimeNanoseconds=json.loads(p.read_text())["baseTimeNanoseconds"] + 154 * 10**9)
    out["plain"] = recording(root / "plain", "plain_ddp", 10)
    for p in out["plain"]:  # someone else's script: torch's distributedInfo, no ddp.meta
        rewrite(p, **{"ddp.meta": None})
    return out


@pytest.mark.parametrize("jobs", [1, 2])
@pytest.mark.parametrize(
    "first, second, says",
    [
        (
            "ten",
            "four",
            ["overlap.rank0.json is run overlap, 2 ranks, run id aaaa", "run id bbbb", "different run ids"],
        ),
        ("ten", "other_id", ["run id aaaa", "run id cccc"]),
        ("no_id", "four", ["10 steps measured", "4 steps measured", "different step counts"]),
        ("no_id", "later", ["captured for", "recorded 154.0 s apart"]),
        (
            "no_id",
            "plain",
            ["overlap.rank0.json is run overlap", "plain_ddp.rank1.json is a run, 2 ranks", "another program"],
        ),
    ],
)
def test_ranks_of_two_recordings_are_refused_naming_both(runs, capsys, first, second, says, jobs):
    line = one_line(*merge(capsys, runs[first][0], runs[second][1], jobs=jobs))
    assert line.startswith("error: cannot merge files of different runs: ")
    for text in says:
        assert text in line, line


def test_step_counts_found_in_the_traces_tell_runs_apart_when_ddp_meta_does_not(tmp_path, capsys):
    ten = recording(tmp_path / "a", "overlap", 10)
    four = recording(tmp_path / "b", "overlap", 4)
    for p in [*ten, *four]:
        rewrite(p, **{"ddp.meta": {**json.loads(p.read_text())["ddp.meta"], "steps": None}})
    line = one_line(*merge(capsys, ten[0], four[1]))
    assert "10 steps in the trace" in line and "4 steps in the trace" in line


def test_one_runs_ranks_still_merge(runs, capsys):
    for name in ("ten", "no_id", "later", "plain"):
        code, out, err = merge(capsys, *runs[name])
        assert code == 0, err
        (trace,) = json.loads(out)["traces"]
        assert [r["rank"] for r in trace["ranks"]] == [0, 1]


def test_report_of_a_mixed_merge_writes_nothing(runs, tmp_path, capsys):
    code = report.main([str(runs["ten"][0]), str(runs["four"][1]), "--merge", "-o", str(tmp_path / "r")])
    one_line(code, *capsys.readouterr())
    assert not (tmp_path / "r").exists()


def test_the_rule_compares_only_what_both_files_say():
    a, b = FileIdentity("a", "naive", 2, (0,)), FileIdentity("b", "naive", 2, (1,))
    check_one_run([a, b])
    check_one_run([FileIdentity("a", None, None, (0,), run_id="x"), FileIdentity("b", None, None, (1,))])
    check_one_run([FileIdentity("a", None, None, (0,), span_ns=(0, 10)), FileIdentity("b", None, None, (1,))])
    overlapping = (0, 5 * 10**9), (4 * 10**9, 9 * 10**9)  # clocks of two hosts: a little apart, never minutes
    check_one_run(
        [FileIdentity(n, None, None, (r,), span_ns=s) for n, r, s in zip("ab", (0, 1), overlapping, strict=True)]
    )
    with pytest.raises(TraceError, match=r"recorded 2\.0 s apart"):
        check_one_run(
            [
                FileIdentity("a", None, None, (0,), span_ns=(0, 10**8)),
                FileIdentity("b", None, None, (1,), span_ns=(21 * 10**8, 22 * 10**8)),
            ]
        )
