"""`bash run_nsys.sh naive overlap` on CPU under the real nsys: every rank's NVTX ranges, and only the
measured steps, land in each .sqlite; the analysis then sees overlap hide far more communication."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

import pytest

from analysis.overlap import command as overlap
from tests.profiling.test_nsys import REPO
from tests.support import owned
from tests.support.nsys import RECORDS_WITH_NSYS
from tests.support.recordings import KEEP, STEPS, WARMUP

pytestmark = RECORDS_WITH_NSYS
PHASES = ("forward", "backward", "grad_sync", "optimizer")

# Each rank's NVTX rows, names resolved (nsys keeps registered strings in StringIds).
NVTX_ROWS = """
SELECT (e.globalTid >> 24) & 16777215 AS pid, e.eventType AS kind, COALESCE(e.text, s.value) AS name,
       e.start, e."end"
FROM NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = e.textId
WHERE e.eventType IN (34, 59, 60)
"""


@pytest.fixture(scope="module")
def traces(nsys_recordings) -> Path:
    """The folder of the suite's recordings (tests/support/recordings.py), naive and overlap in it."""
    return nsys_recordings("naive", "overlap")


def rows_by_rank(sqlite: Path) -> dict[int, list[tuple]]:
    """NVTX rows grouped by rank, the rank read from each process's own ddp.meta mark."""
    con = sqlite3.connect(f"file:{sqlite}?mode=ro", uri=True)
    rows = con.execute(NVTX_ROWS).fetchall()
    con.close()
    metas = {
        pid: json.loads(name.split(" ", 1)[1])
        for pid, kind, name, *_ in rows
        if kind == 34 and name.startswith("ddp.meta ")
    }
    return {metas[pid]["rank"]: [r for r in rows if r[0] == pid] for pid in metas} | {"meta": metas}


def expected_collectives_per_step() -> int:
    """naive and overlap issue one all-reduce per trainable parameter of the tiny model."""
    from ddp.strategies.base import named_trainable_parameters
    from ddp.training.models import build_model

    return len(named_trainable_parameters(build_model("tiny")))


def test_outputs_are_written_and_nothing_else_is_touched(traces, nsys_recordings):
    assert sorted(p.name for p in traces.iterdir()) == nsys_recordings.outputs()  # no partial or temporary file
    assert {"naive.nsys-rep", "naive.sqlite", "overlap.nsys-rep", "overlap.sqlite"} <= set(nsys_recordings.outputs())
    assert (traces / KEEP).read_text() == "not ours"
    for impl in ("naive", "overlap"):  # the summary on stdout names what the run wrote
        run = nsys_recordings.runs[impl]
        assert {"impl": impl, "sqlite": str(traces / f"{impl}.sqlite")}.items() <= next(
            row for row in json.loads(run.stdout) if row["impl"] == impl
        ).items()


@pytest.mark.parametrize("impl, comm_kind", [("naive", 59), ("overlap", 60)])
def test_every_rank_has_the_measured_steps_phases_and_one_range_per_collective(traces, impl, comm_kind):
    by_rank = rows_by_rank(traces / f"{impl}.sqlite")
    metas = by_rank.pop("meta")
    assert sorted(by_rank) == [0, 1]
    for meta in metas.values():
        assert meta["implementation"] == impl and meta["world_size"] == 2 and meta["backend"] == "gloo"
        assert meta["model"] == "tiny" and meta["profiler"].startswith("nsys ")
        assert meta["versions"]["nvtx"] == "0.2.10" and meta["versions"]["torch"]
        assert meta["versions"]["nccl_loaded"] is None  # CPU-only torch maps no libnccl
        assert meta["versions"]["cuda"] is None and meta["versions"]["nccl"] is None  # JSON null, no "None"
    per_step = expected_collectives_per_step()
    for rank, rows in by_rank.items():
        names = [name for _, kind, name, *_ in rows if kind == 59]
        steps = sorted(n for n in names if n.startswith("step "))
        # warm-up steps 0..WARMUP-1 ran before the capture range and are absent
        assert steps == [f"step {i}" for i in range(WARMUP, WARMUP + STEPS)], (rank, steps)
        for phase in PHASES:
            assert names.count(phase) == STEPS, (rank, phase)
        assert names.count("profile") == 1
        comm = [r for r in rows if r[2].startswith("comm:all_reduce:")]
        assert len(comm) == STEPS * per_step, rank
        assert {kind for _, kind, *_ in comm} == {comm_kind}  # blocking push/pop vs async start/end
        assert all(end is not None and end >= start for *_, start, end in comm)


def test_every_captured_range_lies_inside_its_ranks_profile_range(traces):
    for impl in ("naive", "overlap"):
        by_rank = rows_by_rank(traces / f"{impl}.sqlite")
        by_rank.pop("meta")
        for rows in by_rank.values():
            ((p_start, p_end),) = [(s, e) for _, kind, name, s, e in rows if name == "profile"]
            starts = [s for *_, s, _ in rows]
            assert min(starts) >= p_start and max(e for *_, e in rows if e is not None) <= p_end


def test_overlap_hides_far_more_communication_than_naive(traces, capsys):
    assert overlap.main(["--format", "json", str(traces / "naive.sqlite"), str(traces / "overlap.sqlite")]) == 0
    summary = {t["implementation"]: t["summary"] for t in json.loads(capsys.readouterr().out)["traces"]}
    assert summary["naive"]["ranks"] == summary["overlap"]["ranks"] == 2
    assert summary["naive"]["overlap_pct"] < 10, summary["naive"]
    assert summary["overlap"]["overlap_pct"] > summary["naive"]["overlap_pct"] + 25, summary


def test_a_cpu_run_shows_no_gpu_driver_or_cuda(traces, capsys):
    """On a machine without a GPU nsys still reports a CUDA driver version (its own bundled CUDA's) beside
    NvDriverVersion 0: the analysis shows neither, nor placeholders for the CUDA and NCCL torch lacks."""
    with sqlite3.connect(f"file:{traces / 'naive.sqlite'}?mode=ro", uri=True) as con:
        env = dict(con.execute("SELECT name, value FROM TARGET_INFO_SYSTEM_ENV").fetchall())
        exported_by = dict(con.execute("SELECT name, value FROM EXPORT_META_DATA").fetchall())
    assert str(env["NvDriverVersion"]) == "0" and str(env.get("CudaDriverVersion", "")).isdigit()  # the trap
    assert overlap.main([str(traces / "naive.sqlite"), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    (trace,) = doc["traces"]
    about = trace["metadata"]
    assert {k: about[k] for k in ("gpus", "driver", "cuda_driver", "cuda", "nccl")} == dict.fromkeys(
        ("gpus", "driver", "cuda_driver", "cuda", "nccl")
    )
    assert about["torch"].endswith("+cpu") and (about["backend"], about["world_size"]) == ("gloo", 2)
    assert trace["profiler"] == f"nsys {exported_by['EXPORT_PRODUCT_VERSION']}"
    assert overlap.main([str(traces / "naive.sqlite")]) == 0
    table = capsys.readouterr().out
    about_line = next(line for line in table.splitlines() if line.startswith("naive.sqlite: "))  # notes follow it
    assert about_line.startswith("naive.sqlite: torch ") and about_line.endswith(f"; profiler {trace['profiler']}")
    for word in ("gpus", "driver", "cuda", "nccl", "None", "none", "<NA>"):
        assert word not in about_line, about_line


def test_a_failing_run_exits_1_and_leaves_previous_outputs(tmp_path):
    (tmp_path / "naive.sqlite").write_text("previous")
    # A setting only the ranks read, so the run starts and fails (bad run settings are refused up front).
    res = owned.run(
        ["bash", str(REPO / "run_nsys.sh"), "naive", "--gpus", "0", "-o", str(tmp_path), "--model", "toy"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "DDP_TIMEOUT_S": "bogus"},
    )
    assert res.returncode == 1
    assert "DDP_TIMEOUT_S='bogus'" in res.stderr
    assert "error: naive: the profiled run failed (exit 2)" in res.stderr and "Traceback" not in res.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["naive.sqlite"]
    assert (tmp_path / "naive.sqlite").read_text() == "previous"
