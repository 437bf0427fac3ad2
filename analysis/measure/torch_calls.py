"""Collective calls of processes that carry none of our `comm:<op>:<tag>` ranges: PyTorch's own
collective annotations (`gloo:all_gather`, `nccl:reduce_scatter`, ... recorded by the process group,
on its worker thread for gloo), as `collective_calls` reads ours: `foreign_comm_ranges(trace)`.

op   the annotation's name after the backend (`gloo:all_gather` -> all_gather), except that FSDP2 on
     gloo reduce-scatters with an all-reduce (gloo has no reduce-scatter of its own: the annotation
     says all_reduce, the c10d op is `_reduce_scatter_base_`): an all_reduce issued inside FSDP2's
     `FSDP::post_backward_reduce` range of its process is the reduce_scatter it implements.
tag  the module of the innermost FSDP2 range (`FSDP::all_gather (layers.0.up)`) open in the process
     when the call began ('' outside them): which layer's parameters moved.
payload -1: such annotations carry no byte count.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.measure.phases import codes, keyed_contains, process_key
from analysis.trace.frames import NVTX_MARK

TORCH_COLLECTIVE = r"^(?:gloo|nccl|mpi|ucc|xccl):(\w+)$"
FSDP_REDUCE = r"^FSDP::post_backward_reduce\b"
# Where an FSDP2 rank on gloo/CPU waits for communication: its collectives there are synchronous (the
# caller blocks while gloo's thread runs them), inside these ranges; their small copy-in counts as
# waiting too. CPU-only traces cut them out of compute as they cut out `grad_sync` (activity.py).
FSDP_WAIT = r"^FSDP::(all_gather|post_backward_reduce|post_backward_rs_wait)\b"
FSDP_MODULE = r"^FSDP::\w+ \(([^)]+)\)"  # `FSDP::all_gather (layers.0.up)`, group 1 the module


def foreign_comm_ranges(nvtx: pd.DataFrame, skip: pd.DataFrame) -> pd.DataFrame:
    """The torch collective annotations (nvtx rows plus op, tag) of the processes that have no row in
    `skip` (part, pid: the processes with our comm ranges)."""
    is_range = codes(nvtx["kind"]) != NVTX_MARK
    text = nvtx["text"].astype(str)
    op = text.str.extract(TORCH_COLLECTIVE)[0]
    ranges = nvtx[is_range & op.notna().to_numpy()].assign(op=op[op.notna()])
    if len(skip) and len(ranges):
        ours = np.isin(process_key(ranges["part"], ranges["pid"]), process_key(skip["part"], skip["pid"]))
        ranges = ranges[~ours]
    if len(ranges) == 0:
        return ranges.assign(tag=pd.Series(dtype=object))
    part, pid, t = ranges["part"].to_numpy(), ranges["pid"].to_numpy(), ranges["start"].to_numpy(np.int64)
    reduce = nvtx[is_range & text.str.contains(FSDP_REDUCE).to_numpy()]
    inside = keyed_contains(
        process_key(reduce["part"], reduce["pid"]), reduce["start"], reduce["end"], process_key(part, pid), t
    )
    op_values = ranges["op"].to_numpy(dtype=object)
    op_values[inside & (op_values == "all_reduce")] = "reduce_scatter"
    return ranges.assign(op=op_values, tag=_fsdp_module(nvtx[is_range], part, pid, t))


def _fsdp_module(ranges: pd.DataFrame, part: np.ndarray, pid: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Per time: the module named by the latest-opened FSDP2 range of its process still open then."""
    module = ranges["text"].astype(str).str.extract(FSDP_MODULE)[0]
    fsdp = ranges[module.notna().to_numpy()].assign(module=module[module.notna()])
    out = np.full(t.shape, "", dtype=object)
    if len(fsdp) == 0:
        return out
    fsdp = fsdp.assign(key=process_key(fsdp["part"], fsdp["pid"])).sort_values("start", kind="stable")
    probe = pd.DataFrame({"key": process_key(part, pid), "t": t, "i": np.arange(t.size)}).sort_values("t")
    found = pd.merge_asof(probe, fsdp[["key", "start", "end", "module"]], left_on="t", right_on="start", by="key")
    open_then = found["end"].to_numpy(dtype=float) > found["t"].to_numpy()
    out[found["i"].to_numpy()] = np.where(open_then, found["module"].fillna("").to_numpy(dtype=object), "")
    return out
