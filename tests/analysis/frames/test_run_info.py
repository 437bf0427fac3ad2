"""frames/run_info: metadata as it is: what a run did not have is None, never a placeholder string, and
the profiler is named with its version."""

import pandas as pd

from analysis.engine.runs import load_trace
from analysis.frames.run_info import profiler_label, trace_metadata
from analysis.views.table import format_table
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
