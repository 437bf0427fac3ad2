"""The one clock rule: files of a run land on the first file's clock by their recorded offsets, the
same way in the one-piece load and in the per-file merge, without touching the caller's frames."""

import numpy as np
import pandas as pd

from analysis.run.clocks import PartClock, align_clocks, clock_shifts, recorded_clocks
from analysis.trace.frames import CLOCK_OFFSET_KEY, Trace


def _trace(offsets: list[int]) -> Trace:
    gpu = pd.DataFrame(
        {
            "part": [0, 1, 1],
            "start": [100, 200, 300],
            "end": [150, 250, 350],
            "launch_start": [90, -1, 290],
        }
    )
    nvtx = pd.DataFrame({"part": [0, 1], "start": [10, 20], "end": [60, 70]})
    return Trace(
        path="a, b",
        profiler="nsys",
        profiler_version="x",
        source="kernels",
        gpu_ops=gpu,
        nvtx=nvtx,
        ranks=pd.DataFrame(),
        info={i: {CLOCK_OFFSET_KEY: o} for i, o in enumerate(offsets)},
    )


def test_shifts_are_the_recorded_offsets_relative_to_the_first_file():
    assert clock_shifts([PartClock(1_000), PartClock(1_700), PartClock(400)]) == [0, 700, -600]
    assert clock_shifts([]) == []


def test_align_moves_each_part_and_keeps_missing_times_and_the_callers_frames():
    trace = _trace([5_000, 5_030])
    assert [c.recorded_offset_ns for c in recorded_clocks(trace)] == [5_000, 5_030]
    aligned = align_clocks(trace)
    assert aligned.gpu_ops["start"].tolist() == [100, 230, 330]
    assert aligned.gpu_ops["launch_start"].tolist() == [90, -1, 320]  # -1: no launch, stays none
    assert aligned.nvtx["end"].tolist() == [60, 100]
    assert trace.gpu_ops["start"].tolist() == [100, 200, 300]  # the caller's frame is as it was
    same = _trace([7, 7])
    assert align_clocks(same) is same  # one clock already: nothing copied


def test_a_file_without_a_recorded_offset_counts_as_zero():
    trace = _trace([0, 0])
    trace.info[1].pop(CLOCK_OFFSET_KEY)
    assert np.array_equal(align_clocks(trace).gpu_ops["start"], trace.gpu_ops["start"])
