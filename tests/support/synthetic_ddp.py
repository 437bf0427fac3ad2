"""A DDP-shaped nsys trace of any size: `write_ddp_trace(path, n_kernels=1_000_000, n_ranks=8)`.

Per rank (one process, one GPU) and step: forward kernels, backward kernels launched from an
autograd thread with NCCL all-reduce kernels on a second stream overlapping them (each inside an
async `comm:all_reduce:bucketN` start/end range whose payload is the bucket's bytes, opened on the
autograd thread and closed on the main thread), a `grad_sync` wait, optimizer kernels; NVTX
`step N`/`forward`/`backward`/`grad_sync`/`optimizer` push/pop ranges inside a `profile` range, and
a `ddp.meta` mark. Every kernel has its `cudaLaunchKernel` runtime row. Used by the tests (against an
independent computation) and by the speed benchmarks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from contract import ALL_REDUCE, BACKWARD, FORWARD, GRAD_SYNC, OPTIMIZER, PROFILE, comm_range, step_range
from tests.support.synthetic import START_END, NsysWriter

if TYPE_CHECKING:  # synthetic_kineto imports this module
    from tests.support.synthetic_kineto import KinetoWriter

US = 1_000
LAUNCH_LEAD = 30 * US  # the CPU runs this far ahead of the GPU
COMPUTE_STREAM, COMM_STREAM = 7, 20
COMPUTE_NAMES = np.array(
    ["ampere_sgemm_128x64_tn", "vectorized_elementwise_kernel", "reduce_kernel", "vectorized_layer_norm_kernel"],
    dtype=object,
)


@dataclass(frozen=True)
class DdpShape:
    """Sizes of the synthetic run; validates itself."""

    n_kernels: int = 1_000_000
    n_ranks: int = 8
    n_steps: int = 0  # 0: about 2,500 kernels per step
    comm_per_step: int = 25

    def __post_init__(self) -> None:
        for name in ("n_kernels", "n_ranks", "comm_per_step"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)}: must be >= 1")
        if self.n_steps < 0:
            raise ValueError(f"n_steps={self.n_steps}: must be >= 0")
        if self.per_step < 8:
            raise ValueError(f"n_kernels={self.n_kernels}: too few for {self.n_ranks} ranks x {self.steps} steps")

    @property
    def steps(self) -> int:
        return self.n_steps or max(1, self.n_kernels // self.n_ranks // 2_500)

    @property
    def per_step(self) -> int:
        return self.n_kernels // self.n_ranks // self.steps


def bucket_bytes(n: int) -> np.ndarray:
    """Byte count of buckets 0..n-1 (the comm ranges' payloads): 1 MiB, 2 MiB, 3 MiB, ..."""
    return (np.arange(n, dtype=np.int64) + 1) << 20


def _sequential(rng: np.random.Generator, t0: int, n: int, lo_us: float, hi_us: float) -> tuple[np.ndarray, np.ndarray]:
    """n back-to-back kernels on one stream from t0 with 1-3 us gaps."""
    dur = rng.integers(int(lo_us * US), int(hi_us * US), n)
    gap = rng.integers(1 * US, 3 * US, n)
    start = t0 + np.cumsum(gap + dur) - dur
    return start, start + dur


def _write_step(
    w: NsysWriter | KinetoWriter, rng: np.random.Generator, pid: int, rank: int, step: int, t0: int, shape: DdpShape
) -> int:
    """One training step from GPU time t0; returns the GPU time the next step may start."""
    main, autograd = pid, pid + 1
    comm_n = min(shape.comm_per_step, shape.per_step // 4)
    compute_n = shape.per_step - comm_n
    fwd_n, bwd_n = compute_n // 3, compute_n // 2
    opt_n = compute_n - fwd_n - bwd_n
    f_s, f_e = _sequential(rng, t0, fwd_n, 5, 20)
    b_s, b_e = _sequential(rng, int(f_e[-1]), bwd_n, 5, 20)
    # an all-reduce is issued after evenly spaced backward kernels and runs beside the later ones
    issue = np.linspace(bwd_n // comm_n, bwd_n - 1, comm_n).astype(np.int64)
    c_dur = rng.integers(40 * US, 120 * US, comm_n)
    c_s = np.maximum.accumulate(b_s[issue] + 2 * US)
    for i in range(1, comm_n):  # one stream: each waits for the previous (comm_n is small)
        c_s[i] = max(c_s[i], c_s[i - 1] + c_dur[i - 1] + US)
    c_e = c_s + c_dur
    o_s, o_e = _sequential(rng, int(max(b_e[-1], c_e[-1])) + 5 * US, opt_n, 2, 8)
    f_l, b_l, o_l = f_s - LAUNCH_LEAD, b_s - LAUNCH_LEAD, o_s - LAUNCH_LEAD
    c_l = b_l[issue] + 500  # launched right after the backward kernel that completed the bucket
    name = lambda n: COMPUTE_NAMES[rng.integers(0, COMPUTE_NAMES.size, n)]
    w.kernels(pid, main, rank, COMPUTE_STREAM, f_s, f_e, name(fwd_n), launch=f_l)
    w.kernels(pid, autograd, rank, COMPUTE_STREAM, b_s, b_e, name(bwd_n), launch=b_l)
    w.kernels(pid, autograd, rank, COMM_STREAM, c_s, c_e, "ncclDevKernel_AllReduce_Sum_f32_RING_LL", launch=c_l)
    w.kernels(pid, main, rank, COMPUTE_STREAM, o_s, o_e, name(opt_n), launch=o_l)
    ranges = [
        (FORWARD, f_l[0] - 500, f_l[-1] + 500),
        (BACKWARD, b_l[0] - 500, b_l[-1] + 1_000),
        (GRAD_SYNC, b_l[-1] + 1_500, o_l[0] - 1_000),
        (OPTIMIZER, o_l[0] - 500, o_l[-1] + 500),
        (step_range(step), f_l[0] - 1_000, o_l[-1] + 1_000),
    ]
    w.nvtx(
        pid,
        main,
        np.array([r[1] for r in ranges]),
        np.array([r[2] for r in ranges]),
        np.array([r[0] for r in ranges], dtype=object),
    )
    w.nvtx(
        pid,
        autograd,
        c_l - 200,
        c_e - LAUNCH_LEAD + 1_000,
        np.array([comm_range(ALL_REDUCE, f"bucket{i}") for i in range(comm_n)], dtype=object),
        kind=START_END,
        end_tid=main,
        payload=bucket_bytes(comm_n),
    )
    return int(o_e[-1]) + 50 * US


def write_ddp_trace(
    path: str | Path,
    n_kernels: int = 1_000_000,
    n_ranks: int = 8,
    n_steps: int = 0,
    comm_per_step: int = 25,
    flavour: str = "2026",
    shuffle: bool = False,
    seed: int = 0,
    first_rank: int = 0,
    world_size: int = 0,
    session_start_utc_ns: int | None = None,
    implementation: str = "synthetic",
) -> Path:
    """Write a DDP-shaped export (see module docstring); kernels split evenly over ranks and steps.
    first_rank/world_size: ranks first_rank.. of a run of world_size (default n_ranks) ranks, as one
    rank's file of `run_nsys.sh --per-rank` holds; session_start_utc_ns: the export's capture start;
    implementation: what its ddp.meta marks name the run."""
    shape = DdpShape(n_kernels, n_ranks, n_steps, comm_per_step)
    w = (
        NsysWriter(path, flavour=flavour, shuffle=shuffle, seed=seed)
        if session_start_utc_ns is None
        else NsysWriter(path, flavour=flavour, shuffle=shuffle, seed=seed, session_start_utc_ns=session_start_utc_ns)
    )
    rng = np.random.default_rng(seed)
    for rank in range(first_rank, first_rank + n_ranks):
        pid = 1000 + 10 * rank
        w.process(pid, threads={pid: "python3", pid + 1: "pt_autograd_0"})
        t = 1_000_000_000 + int(rng.integers(0, 100 * US))
        w.meta_mark(
            pid,
            pid,
            t - 2 * LAUNCH_LEAD,
            implementation=implementation,
            rank=rank,
            world_size=world_size or n_ranks,
            local_rank=rank,
            backend="nccl",
            device=f"cuda:{rank}",
        )
        first = t
        for step in range(shape.steps):
            t = _write_step(w, rng, pid, rank, step, t, shape)
        w.nvtx(pid, pid, [first - 2 * LAUNCH_LEAD + 100], [t], PROFILE)
    return w.close()


def write_rank_files(
    folder: Path,
    run: str,
    kernels: Sequence[int],
    n_steps: int,
    t0: int,
    shifts_ns: Sequence[int] | None = None,
    implementation: str = "synthetic",
) -> list[Path]:
    """`<run>.rank<N>.sqlite` in `folder`, one file per rank as `run_nsys.sh --per-rank` writes them: rank r
    holds kernels[r] kernels (seed r) of a run of len(kernels) ranks, its capture started at t0 + shifts_ns[r]
    (default r ms)."""
    shifts = list(shifts_ns) if shifts_ns is not None else [r * 1_000_000 for r in range(len(kernels))]
    return [
        write_ddp_trace(
            folder / f"{run}.rank{r}.sqlite",
            n_kernels=n,
            n_ranks=1,
            n_steps=n_steps,
            first_rank=r,
            world_size=len(kernels),
            seed=r,
            session_start_utc_ns=t0 + shifts[r],
            implementation=implementation,
        )
        for r, n in enumerate(kernels)
    ]
