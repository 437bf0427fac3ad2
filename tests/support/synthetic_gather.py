"""Small fsdp-shaped GPU exports, one per cause of a late all-gather (fsdp_units/gather_cause.py).

Two ranks (pids 800 and 900, GPUs 0 and 1), one step [0, 1000) µs with forward [0, 900); compute on
stream 7, NCCL on stream 20. Each gather is the contract's shape: an async `comm:all_gather:<unit>`
range from its issue (payload: bytes), its NCCL kernel launched from the same thread, a push/pop
`comm_wait:all_gather:<unit>` range where the rank waits for it, then the unit's first compute
kernel. `Gather` gives one gather's times (µs) on one rank; the writer turns them into rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from contract import ALL_GATHER, REDUCE_SCATTER, comm_range, comm_wait_range, step_range
from tests.support.synthetic import START_END, NsysWriter

US = 1_000
PIDS = (800, 900)
GATHER_KERNEL = "ncclDevKernel_AllGather_RING_LL"
BYTES = 1 << 20


@dataclass(frozen=True)
class Gather:
    """One gather on one rank, µs: issue (range start), launch and run [start, end) of its kernel, its
    wait range [wait, wait + 5), the unit's first compute kernel launched at `use` and run
    [use_start, use_start + 20) (default: use + 2), after a compute kernel [busy_from, busy_until)."""

    unit: str
    issue: int
    start: int
    end: int
    wait: int | None  # None: no comm_wait range (as PyTorch's FSDP2)
    use: int
    busy_from: int = 10
    busy_until: int = 100
    use_start: int | None = None


def _kernel(w: NsysWriter, pid: int, device: int, stream: int, start: int, end: int, name: str, launch: int) -> None:
    w.kernels(
        pid, pid, device, stream, np.array([start * US]), np.array([end * US]), name, launch=np.array([launch * US])
    )


def write_gathers(
    path: str | Path, per_rank: tuple[list[Gather], list[Gather]], queue: tuple[int, int] | None = None
) -> Path:
    """Both ranks' gathers (per_rank[r]); `queue` = (start, end) µs: a reduce-scatter of unit `prev`
    issued at 1, launched at 2, running on each rank's NCCL stream before the gathers."""
    w = NsysWriter(path, flavour="2026", shuffle=True, seed=21)
    for rank, (pid, gathers) in enumerate(zip(PIDS, per_rank, strict=True)):
        w.process(pid)
        w.meta_mark(pid, pid, 0, implementation="fsdp", rank=rank, world_size=2, backend="nccl")
        w.nvtx(
            pid, pid, np.array([0, 0]), np.array([1000, 900]) * US, np.array([step_range(0), "forward"], dtype=object)
        )
        if queue is not None:
            w.nvtx(
                pid,
                pid,
                np.array([1 * US]),
                np.array([999 * US]),
                comm_range(REDUCE_SCATTER, "prev"),
                kind=START_END,
                payload=np.array([BYTES]),
            )
            _kernel(w, pid, rank, 20, queue[0], queue[1], "ncclDevKernel_ReduceScatter_Sum_f32_RING_LL", 2)
        for g in gathers:
            w.nvtx(
                pid,
                pid,
                np.array([g.issue * US]),
                np.array([999 * US]),
                comm_range(ALL_GATHER, g.unit),
                kind=START_END,
                payload=np.array([BYTES]),
            )
            _kernel(w, pid, rank, 20, g.start, g.end, GATHER_KERNEL, g.issue + 1)
            if g.wait is not None:
                wait = comm_wait_range(ALL_GATHER, g.unit)
                w.nvtx(pid, pid, np.array([g.wait * US]), np.array([(g.wait + 5) * US]), wait)
            _kernel(w, pid, rank, 7, g.busy_from, g.busy_until, "gemm", max(g.busy_from - 5, 0))
            use_start = g.use_start if g.use_start is not None else max(g.use + 2, g.end, g.busy_until)
            _kernel(w, pid, rank, 7, use_start, use_start + 20, "gemm", g.use)
    return w.close()
