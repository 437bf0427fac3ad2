"""Kineto's collective calls as the `collectives` frame (columns: trace/frames.py COLLECTIVE_COLUMNS).

Kineto traces carry them: PyTorch wraps every c10d collective in a `record_param_comms` CPU op
whose args hold the collective's name, element counts, dtype and process group; on GPUs it puts the
same args on the NCCL kernels, whose sizes (kineto_sizes.kernel_bytes) become gpu_ops.comm_bytes. nsys exports do
not, so their frame is empty (same columns). One row per `record_param_comms` op; `bytes` is
max(in_bytes, out_bytes) (nccl-tests' "size": the full buffer, i.e. the gathered output of all_gather,
the input of reduce_scatter). `wait` rows (PyTorch records its waits the same way) have 0 bytes.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.trace.frames import empty_collectives
from analysis.trace.readers.kineto_sizes import count, group_name, sizes


def collectives_frame(calls: list[tuple[int, tuple]]) -> pd.DataFrame:
    """The frame from (part, (pid, tid, start, end, args)) pairs; args has collective, in_nelems,
    out_nelems, dtype, group_size, pg_name and pg_desc attributes. One Python pass per collective
    call: a trace holds thousands of them, not millions of events."""
    if not calls:
        return empty_collectives()
    part = [p for p, _ in calls]
    pid, tid, start, end, args = zip(*(c for _, c in calls), strict=True)
    found = sizes(args)
    dtype, size, n_in, n_out, b_in, b_out = (found[k] for k in ("dtype", "size", "n_in", "n_out", "b_in", "b_out"))
    frame = pd.DataFrame(
        {
            "part": np.array(part, dtype=np.int64),
            "pid": np.array(pid, dtype=np.int64),
            "tid": np.array(tid, dtype=np.int64),
            "start": np.array(start, dtype=np.int64),
            "end": np.array(end, dtype=np.int64),
            "collective": pd.Series(
                [str(a.collective) if a.collective is not None else "" for a in args], dtype=object
            ),
            "dtype": pd.Series(dtype, dtype=object),
            "element_bytes": size,
            "in_nelems": n_in,
            "out_nelems": n_out,
            "in_bytes": b_in,
            "out_bytes": b_out,
            "bytes": np.maximum(b_in, b_out),
            "group_size": np.array([count(a.group_size) for a in args], dtype=np.int64),
            "process_group": pd.Series([group_name(a.pg_name, a.pg_desc) for a in args], dtype=object),
        }
    )
    return frame.sort_values(["part", "pid", "start"], kind="stable").reset_index(drop=True)
