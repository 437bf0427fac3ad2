"""trace/run_info: metadata as it is: what a run did not have is None, never a placeholder string, and
the profiler is named with its version."""

import json
import sqlite3

import pandas as pd
import pytest

from analysis.render.table import format_table
from analysis.run.loaded_run import load_trace
from analysis.trace.run_info import MEMORY_COLUMNS, profiler_label, trace_metadata
from tests.support.synthetic import NsysWriter


def _cpu_export(path, versions):
    w = NsysWriter(path, cupti=False)
    w.process(300)
    w.meta_mark(300, 300, 1, implementation="cpu", rank=0, world_size=1, backend="gloo", versions=versions)
    w.nvtx(300, 300, [0], [100], ["step 0"], registered=True)
    return w.close()


def test_placeholders_older_runs_recorded_read_as_missing(tmp_path):
    """Runs before null was recorded wrote str(None) for CUDA and "none" for NCCL on a CPU build."""
    trace = load_trace(_cpu_export(tmp_path / "old.sqlite", {"torch": "2.13.0+cpu", "cuda": "None", "nccl": "none"}))
    about = trace_metadata(trace)
    assert (about["gpus"], about["driver"], about["cuda_driver"], about["cuda"], about["nccl"]) == (None,) * 5
    assert (about["torch"], about["backend"], about["world_size"]) == ("2.13.0+cpu", "gloo", 1)


def test_null_versions_are_missing_and_the_profiler_is_named_with_its_version(tmp_path):
    trace = load_trace(_cpu_export(tmp_path / "new.sqlite", {"torch": "2.13.0+cpu", "cuda": None, "nccl": None}))
    assert trace_metadata(trace)["cuda"] is None and trace_metadata(trace)["nccl"] is None
    assert (trace.profiler, trace.profiler_version) == ("nsys", "2026.2.1.210")  # the synthetic export's (2026 flavour)
    assert profiler_label(trace) == "nsys 2026.2.1.210"


def test_tables_show_every_kind_of_missing_value_as_a_dash():
    frame = pd.DataFrame(
        {
            "text": [None, "x"],
            "ms": [float("nan"), 1.0],
            "count": pd.array([pd.NA, 3], dtype="Int64"),
            "flag": pd.array([pd.NA, True], dtype="boolean"),
        }
    )
    lines = format_table(frame).splitlines()
    assert lines[1].split() == ["-", "-", "-", "-"] and lines[2].split() == ["x", "1.000", "3", "True"]
    assert "<NA>" not in format_table(frame) and "None" not in format_table(frame)


def _memory(scale: int) -> dict:
    """A rank's ddp.meta `memory` in bytes: parts 1..6 MiB times `scale`, their sum, no CUDA."""
    parts = ["parameters", "gradients", "optimizer_state", "gathered", "comm_buffers", "activations"]
    memory = {name: (i + 1) * scale * 2**20 for i, name in enumerate(parts)}
    return {**memory, "peak": sum(memory.values()), "cuda_max_allocated": None}


def test_memory_is_the_largest_ranks_in_mib_and_missing_without_it(tmp_path):
    w = NsysWriter(tmp_path / "mem.sqlite", cupti=False)
    for rank, pid in enumerate((300, 301)):
        w.process(pid)
        w.meta_mark(pid, pid, 1, implementation="x", rank=rank, world_size=2, memory=_memory(rank + 1))
        w.nvtx(pid, pid, [0], [100], ["step 0"], registered=True)
    about = trace_metadata(load_trace(w.close()))
    assert about["mem_parameters_mib"] == 2 and about["mem_activations_mib"] == 12  # rank 1: twice rank 0's
    assert about["mem_peak_mib"] == 2 * 21 and about["cuda_max_allocated_mib"] is None
    old = trace_metadata(load_trace(_cpu_export(tmp_path / "old.sqlite", {"torch": "2.13.0+cpu"})))
    assert all(old[c] is None for c in MEMORY_COLUMNS)  # runs before memory was recorded


def test_nccl_is_the_library_loaded_with_torchs_build_beside_it(tmp_path):
    """ddp.meta records torch's build (`nccl`) and the library the ranks loaded (`nccl_loaded`, an
    LD_PRELOAD may replace torch's): the loaded one is the NCCL shown, the build beside it."""
    from analysis.overlap.analyze import analyze_trace
    from analysis.overlap.command import notes
    from analysis.report.html_report import runs_html
    from analysis.trace.run_info import nccl_label

    versions = {"torch": "2.11.0+cu130", "nccl": "2.28.9", "nccl_loaded": "2.32.3"}
    trace = load_trace(_cpu_export(tmp_path / "preloaded.sqlite", versions))
    about = trace_metadata(trace)
    assert (about["nccl"], about["nccl_build"]) == ("2.32.3", "2.28.9")
    result = analyze_trace(trace)
    assert "nccl 2.32.3 (torch built with 2.28.9)" in notes(result)[0]
    page = runs_html(result.summary.assign(label="x"))
    assert "<th>NCCL</th>" in page and "<td>2.32.3<br>" in page and "(torch built with 2.28.9)</span>" in page
    assert nccl_label("2.32.3", "2.32.3") == nccl_label("2.32.3", None) == "2.32.3"
    assert nccl_label(None, "2.28.9") == "2.28.9 (torch's build; loaded library not recorded)"
    assert nccl_label(None, None) is None and nccl_label("none", float("nan")) is None
    old = trace_metadata(load_trace(_cpu_export(tmp_path / "old.sqlite", {"nccl": "2.28.9"})))
    assert (old["nccl"], old["nccl_build"]) == (None, "2.28.9")  # runs before the loaded one was recorded


@pytest.mark.real  # decompresses and reads a whole real H200 trace
def test_h200_trace_shows_the_nccl_its_ranks_loaded(gpu_h200_trace):
    path = gpu_h200_trace("fsdp_bf16.sqlite")
    db = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
    query = "SELECT COALESCE(e.text, s.value) FROM NVTX_EVENTS e LEFT JOIN StringIds s ON e.textId = s.id"
    texts = [t for (t,) in db.execute(query)]
    versions = [json.loads(t[len("ddp.meta ") :])["versions"] for t in texts if t and t.startswith("ddp.meta ")]
    db.close()
    assert len(versions) == 2 and {v["nccl_loaded"] for v in versions} == {"2.32.3"}
    assert {v["nccl"] for v in versions} == {"2.28.9"}  # torch's build differs: the case this is for
    about = trace_metadata(load_trace(path))
    assert (about["nccl"], about["nccl_build"]) == ("2.32.3", "2.28.9")
