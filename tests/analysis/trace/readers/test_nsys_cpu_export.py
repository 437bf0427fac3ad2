"""A real nsys export of a CPU run (whatever nsys is installed, 2022.4 here): no CUPTI tables, NVTX only."""

import json
import shutil

import pytest

from analysis import analyze
from tests import nsys_cli

NSYS = shutil.which("nsys")
PROGRAM = """
import json, threading, time, nvtx
nvtx.mark(message="ddp.meta " + json.dumps({"implementation": "nsys_cpu", "rank": 0, "world_size": 1}))
for i in range(2):
    nvtx.push_range(f"step {i}")
    nvtx.push_range("forward"); time.sleep(0.01); nvtx.pop_range()
    nvtx.push_range("backward")
    handle = nvtx.start_range("comm:all_reduce:bucket0")
    time.sleep(0.02)
    ender = threading.Thread(target=lambda: nvtx.end_range(handle)); ender.start(); ender.join()
    nvtx.pop_range()
    nvtx.push_range("grad_sync"); nvtx.push_range("comm:all_reduce:final"); time.sleep(0.005)
    nvtx.pop_range(); nvtx.pop_range()
    nvtx.pop_range()
"""


@pytest.mark.nsys  # records with the real nsys
@pytest.mark.skipif(NSYS is None, reason="nsys not installed")
def test_real_cpu_export_is_measured_from_nvtx(tmp_path):
    pytest.importorskip("nvtx")
    path = nsys_cli.record_program(NSYS, tmp_path, PROGRAM, trace="nvtx,osrt")
    result = analyze(path)
    summary = result.summary.iloc[0]
    assert (summary["source"], summary["implementation"], summary["steps"]) == ("ranges", "nsys_cpu", 2)
    steps = result.steps
    assert steps["step"].tolist() == [0, 1] and (steps["comm_ranges"] == 2).all()
    # the async range (~20 ms) runs inside backward; the blocking one (~5 ms) is exposed
    assert (steps["backward_overlap_ms"] > 15).all() and (steps["exposed_comm_ms"] > 4).all()
    assert (steps["overlap_ms"] < steps["comm_ms"]).all()
    json.dumps(result.to_json())
