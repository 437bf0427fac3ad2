"""Small schema-true GPU exports pinning the GPU rules of the analysis (times in ns, worked by hand).

`write_host_not_syncing`: the host never waits for the GPU, so each step's GPU work runs past its
CPU range. `write_host_side_and_copies`: collectives on the host (gloo with CUDA tensors) on one
rank, and a bucket-packing copy inside an async comm range on the other.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from contract import ALL_REDUCE, comm_range, step_range
from tests.support.synthetic import START_END, NsysWriter

NOT_SYNCING = {  # per step: step_ms, compute_ms, comm_ms, overlap_ms, idle_ms (ns)
    0: (150, 130, 40, 20, 50),
    1: (150, 130, 40, 20, 0),
    2: (220, 130, 40, 0, 0),
}


def write_host_not_syncing(path: str | Path) -> Path:
    """One rank (pid 500, GPU 0). CPU `step k` ranges [s, s+100) with s = 0, 150, 300; in each the host
    launches a compute kernel at s+10 that runs [s+50, s+180) on stream 7 and an all-reduce at s+20
    that runs [s+180, s+220) on stream 20, and never waits.
    GPU-aware steps: [0,150), [150,300), and the last [300, 520) (its work ends at 520, after its CPU
    end 400). Step k's comm [s+180, s+220) runs under step k+1's compute [s+200, s+330): overlap 20
    in steps 0 and 1, 0 in step 2. Idle: step 0 waits 50 for its first kernel; steps 1, 2 are busy
    throughout. The CPU ranges (100 each) would say the steps took 100."""
    w = NsysWriter(path, flavour="2026", shuffle=True, seed=11)
    w.process(500)
    w.meta_mark(500, 500, 0, implementation="not_syncing", rank=0, world_size=1, backend="nccl")
    s = np.array([0, 150, 300])
    w.nvtx(500, 500, s, s + 100, np.array([step_range(k) for k in range(3)], dtype=object))
    w.kernels(500, 500, 0, 7, s + 50, s + 180, "gemm", launch=s + 10)
    w.kernels(500, 500, 0, 20, s + 180, s + 220, "ncclDevKernel_AllReduce_Sum_f32_RING_LL", launch=s + 20)
    return w.close()


def write_host_side_and_copies(path: str | Path) -> Path:
    """Two ranks, one step [0, 1000) each.

    Rank 0 (pid 600, GPU 0, backend gloo): compute kernel [100, 600) launched at 50 on stream 7; async
    comm ranges [300, 500) and [550, 800) opened on thread 601; gloo's staging copies on its own
    stream 30, launched at 310 and 560 from thread 601 -> [320, 340), [570, 590). Comm comes from the
    ranges: 450; overlap with compute [300, 500) + [550, 600) = 250; comm_copy 40; no comm kernels.
    Rank 1 (pid 700, GPU 1, backend nccl): compute [100, 600) on stream 7; async range
    comm:all_reduce:bucket0 [200, 700) on thread 700; backward packs the next bucket with a DtoD copy
    on the compute stream launched at 250 -> [600, 650): not communication; the NCCL kernel
    [650, 750) on stream 20 is; a DtoD copy on stream 20 [750, 760) launched at 260 is (comm stream).
    comm = 110 (kernel 100 + copy 10), comm_kernel 100, comm_copy 10, overlap 0."""
    w = NsysWriter(path, flavour="2026", shuffle=True, seed=13)
    w.process(600, threads={600: "python3", 601: "pt_autograd_0"})
    w.meta_mark(600, 600, 0, implementation="fixture", rank=0, world_size=2, backend="gloo")
    w.nvtx(600, 600, np.array([0]), np.array([1000]), step_range(0))
    w.kernels(600, 600, 0, 7, np.array([100]), np.array([600]), "gemm", launch=np.array([50]))
    w.nvtx(
        600,
        601,
        np.array([300, 550]),
        np.array([500, 800]),
        np.array([comm_range(ALL_REDUCE, t) for t in "ab"], dtype=object),
        kind=START_END,
        end_tid=600,
    )
    w.memcpy(600, 601, 0, 30, np.array([320, 570]), np.array([340, 590]), copy_kind=2, launch=np.array([310, 560]))
    w.process(700)
    w.meta_mark(700, 700, 0, implementation="fixture", rank=1, world_size=2, backend="nccl")
    w.nvtx(700, 700, np.array([0]), np.array([1000]), step_range(0))
    w.nvtx(700, 700, np.array([200]), np.array([700]), comm_range(ALL_REDUCE, "bucket0"), kind=START_END)
    w.kernels(700, 700, 1, 7, np.array([100]), np.array([600]), "gemm", launch=np.array([50]))
    w.memcpy(700, 700, 1, 7, np.array([600]), np.array([650]), copy_kind=8, launch=np.array([250]))
    w.kernels(
        700,
        700,
        1,
        20,
        np.array([650]),
        np.array([750]),
        "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
        launch=np.array([255]),
    )
    w.memcpy(700, 700, 1, 20, np.array([750]), np.array([760]), copy_kind=8, launch=np.array([260]))
    return w.close()


NOTICED_LATE_BARRIER = (300, 370)  # launch of each rank's closing barrier (an NCCL all-reduce), after its steps


def write_noticed_late(path: str | Path) -> Path:
    """Two NCCL ranks (pids 800, 900 on GPUs 0, 1), CPU `step 0` [0, 100) and `step 1` [150, 250) each.
    In step s (start 0, 150) each rank launches a compute kernel at s+10 -> [s+20, s+120) on stream 7 and
    an all-reduce of 4096 bytes at s+30 -> [s+120, s+140) on stream 20, inside an async range
    `comm:all_reduce:b` that opens at s+30 and ends where the host noticed the completion: 140 in step 0,
    295 in the last step (after its CPU end, 250). The last step's GPU work ends at 290, so the step lasts
    [150, 290): 140, not the 145 the range's end would give.
    The closing `barrier()` after the steps is an all-reduce kernel with no comm range, launched at 300
    (rank 0) and 370 (rank 1) -> [305, 385) and [380, 385): rank 0 waits 75 for rank 1. It is outside the
    steps: listed with phase "outside steps", not in the summaries or the stragglers."""
    w = NsysWriter(path, flavour="2026", shuffle=True, seed=17)
    for rank, pid in enumerate((800, 900)):
        w.process(pid)
        w.meta_mark(pid, pid, 0, implementation="noticed_late", rank=rank, world_size=2, backend="nccl")
        s = np.array([0, 150])
        w.nvtx(pid, pid, s, s + 100, np.array([step_range(k) for k in range(2)], dtype=object))
        w.kernels(pid, pid, rank, 7, s + 20, s + 120, "gemm", launch=s + 10)
        names = np.array([comm_range(ALL_REDUCE, "b")] * 2, dtype=object)
        w.nvtx(pid, pid, s + 30, np.array([140, 295]), names, kind=START_END, payload=4096)
        w.kernels(pid, pid, rank, 20, s + 120, s + 140, "ncclDevKernel_AllReduce_Sum_f32_RING_LL", launch=s + 30)
        barrier = np.array([(305, 380)[rank]]), np.array([385])
        nccl = "ncclDevKernel_AllReduce_Sum_f32_RING_LL"
        w.kernels(pid, pid, rank, 20, *barrier, nccl, launch=np.array([NOTICED_LATE_BARRIER[rank]]))
    return w.close()
