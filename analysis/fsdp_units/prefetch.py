"""When each sharded module's forward began, where the trace says so: `forward_reached` (used by
gather_rows.py for its `needed_ns`), and PREFETCH_COLUMNS, the forward gathers' columns the
collectives view's `prefetch` gives (rank, step, tag, issue_ns, end_ns, waited_ns: the row's held or
waited time, needed_ns).

needed_ns: when the rank reached the module's forward, where the trace says so: the start of FSDP2's
`FSDP::pre_forward (<module>)` range (the first of the module's ranges in the process that ends after
the call's issue); -1 where the trace has no such range (this
project's `fsdp` marks its collectives, not each module's forward: there, the time compute waited
says how late the gather was). Times on the trace's clock.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from analysis.measure.phases import process_key, ranges_named
from analysis.measure.torch_calls import FSDP_MODULE
from analysis.trace.frames import Trace

PREFETCH_COLUMNS = ["rank", "step", "tag", "issue_ns", "end_ns", "waited_ns", "needed_ns"]
FSDP_PRE_FORWARD = r"^FSDP::pre_forward \(([^)]+)\)"


def _module_key(part: np.ndarray, pid: np.ndarray, module: pd.Series, modules: pd.Index) -> np.ndarray:
    """One int64 per (process, module name), modules numbered by `modules`."""
    return (process_key(part, pid) << 20) | modules.get_indexer(module.to_numpy()).astype(np.int64)


def forward_reached(trace: Trace, part: np.ndarray, pid: np.ndarray, tag: pd.Series, issue: np.ndarray) -> np.ndarray:
    """Per call: start of the first `FSDP::pre_forward (<tag>)` range of its process that ends after
    its issue; -1 where none."""
    out = np.full(len(issue), -1, dtype=np.int64)
    pre = ranges_named(trace.nvtx, re.compile(FSDP_PRE_FORWARD))
    if len(pre) == 0 or len(issue) == 0:
        return out
    module = pre["text"].astype(str).str.extract(FSDP_MODULE)[0].fillna("")
    modules = pd.Index(pd.unique(module.to_numpy()))
    right = pd.DataFrame(
        {
            "key": _module_key(pre["part"].to_numpy(), pre["pid"].to_numpy(), module, modules),
            "end": pre["end"].to_numpy(),
        }
    ).assign(start=pre["start"].to_numpy())
    right = right.sort_values("end", kind="stable")  # a call whose tag names no such module gets key -1: no match
    left = pd.DataFrame(
        {"key": _module_key(part, pid, tag.astype(str), modules), "t": issue + 1, "i": np.arange(len(issue))}
    ).sort_values("t", kind="stable")
    found = pd.merge_asof(left, right, left_on="t", right_on="end", by="key", direction="forward")
    has = found["start"].notna().to_numpy()
    out[found["i"].to_numpy()[has]] = found["start"].to_numpy()[has].astype(np.int64)
    return out
