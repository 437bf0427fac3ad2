"""Each step's backward pass as one span per rank: what the report's charts and timelines highlight."""

from __future__ import annotations

import pandas as pd

from analysis.measure.collective_calls import step_at
from analysis.measure.phases import codes, launched_inside, ranges_named
from analysis.trace.frames import GPU_KERNEL, Trace
from analysis.trace.patterns import Patterns


def backward_spans(trace: Trace, patterns: Patterns | None = None) -> pd.DataFrame:
    """rank, step, start_ns, end_ns of each step's backward pass: on GPU traces the first start to last end
    of the compute kernels launched inside `backward` ranges; on CPU traces the backward ranges (measured
    once per run: loaded_run.LoadedRun.backward_spans)."""
    patterns = patterns or Patterns()
    backward = ranges_named(trace.nvtx, patterns.regex("backward"))
    ops = trace.gpu_ops
    if len(ops):
        mine = (codes(ops["kind"]) == GPU_KERNEL) & ~ops["is_comm"].to_numpy() & launched_inside(ops, backward)
        work = ops.loc[mine, ["part", "pid", "device", "start", "end", "launch_start"]]
        when, keys = work["launch_start"].to_numpy(), ["part", "pid", "device"]
    else:
        work = backward[["part", "pid", "start", "end"]]
        when, keys = work["start"].to_numpy(), ["part", "pid"]
    work = work.assign(step=step_at(trace, patterns, work["part"], work["pid"], when))
    work = work[work["step"] >= 0].merge(trace.ranks[["rank", *keys]].drop_duplicates(keys), on=keys)
    spans = work.groupby(["rank", "step"]).agg(start_ns=("start", "min"), end_ns=("end", "max"))
    return spans.reset_index()
