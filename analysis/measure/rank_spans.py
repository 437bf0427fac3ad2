"""Each rank's spans: its host ranges by kind (`rank_spans`), and each step's backward pass as one span per
rank (`backward_spans`: what the report's charts and timelines highlight).

`rank_spans(trace) -> frame (rank, kind, step, start_ns, end_ns)`. Kinds: `step` (the step ranges, with their
number), the phases `forward`, `backward`, `optimizer` (ours or what the patterns match), `data` (the
contract's range around the making of a step's batch) and `sync_wait` (where the host waited for the gradient
synchronisation: `grad_sync` or what the patterns match). What the straggler causes
(collectives/straggler_cause.py) measure a late rank's time in.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from analysis.measure.collective_calls import step_at
from analysis.measure.phases import codes, find_steps, launched_inside, ranges_named
from analysis.trace.frames import GPU_KERNEL, Trace
from analysis.trace.patterns import Patterns
from contract import DATA

SPAN_COLUMNS = ["rank", "kind", "step", "start_ns", "end_ns"]
PHASE_KINDS = ("forward", "backward", "optimizer")
SYNC_WAIT = "sync_wait"
DATA_RANGE = re.compile(rf"^{re.escape(DATA)}$")


def rank_spans(trace: Trace, patterns: Patterns | None = None, steps: pd.DataFrame | None = None) -> pd.DataFrame:
    """The trace's step, phase and data ranges with their rank (step -1 except on `step` rows); `steps`: its
    phases.find_steps when the caller has them."""
    patterns = patterns or Patterns()
    frames = [(steps if steps is not None else find_steps(trace.nvtx, patterns)).assign(kind="step")]
    for kind in PHASE_KINDS:
        frames.append(ranges_named(trace.nvtx, patterns.regex(kind)).assign(kind=kind, step=-1))
    frames.append(ranges_named(trace.nvtx, DATA_RANGE).assign(kind="data", step=-1))
    frames.append(ranges_named(trace.nvtx, patterns.regex(SYNC_WAIT)).assign(kind=SYNC_WAIT, step=-1))
    spans = pd.concat([f[["part", "pid", "kind", "step", "start", "end"]] for f in frames], ignore_index=True)
    ranks = trace.ranks[["rank", "part", "pid"]].drop_duplicates(["part", "pid"])
    spans = spans.merge(ranks, on=["part", "pid"], how="inner")
    out = pd.DataFrame(
        {
            "rank": spans["rank"].to_numpy(np.int64),
            "kind": spans["kind"].to_numpy(dtype=object),
            "step": spans["step"].to_numpy(np.int64),
            "start_ns": spans["start"].to_numpy(np.int64),
            "end_ns": spans["end"].to_numpy(np.int64),
        }
    )
    return out.sort_values(["rank", "start_ns"], kind="stable").reset_index(drop=True)


def empty_spans() -> pd.DataFrame:
    """A spans frame without rows."""
    return pd.DataFrame({c: pd.Series(dtype=object if c == "kind" else np.int64) for c in SPAN_COLUMNS})


def backward_spans(trace: Trace, patterns: Patterns | None = None, steps: pd.DataFrame | None = None) -> pd.DataFrame:
    """rank, step, start_ns, end_ns of each step's backward pass: on GPU traces the first start to last end
    of the compute kernels launched inside `backward` ranges; on CPU traces the backward ranges (measured
    once per run: loaded_run.LoadedRun.backward_spans; `steps`: the trace's phases.find_steps, as step_at's)."""
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
    work = work.assign(step=step_at(trace, patterns, work["part"], work["pid"], when, steps))
    work = work[work["step"] >= 0].merge(trace.ranks[["rank", *keys]].drop_duplicates(keys), on=keys)
    spans = work.groupby(["rank", "step"]).agg(start_ns=("start", "min"), end_ns=("end", "max"))
    return spans.reset_index()
