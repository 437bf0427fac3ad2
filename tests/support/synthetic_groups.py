"""An HSDP-shaped nsys export of any width, every rank with its own behaviour: `write_hsdp_trace(path, ...)`.

`world = shard * replicas` ranks (one process and GPU each), rank r in shard group r // shard (ranks
shard*g .. shard*g + shard - 1) and replicate group r % shard (ranks r % shard, + shard, ...). Per step each rank runs
forward and backward kernels at its own speed (a per-rank factor, per-kernel noise), and after evenly spaced
backward kernels a reduce-scatter in its shard group followed by an all-reduce of the shard in its replicate group,
on one communication stream: the two groups' calls interleave (rs0 ar0 rs1 ar1 ...). The ranks are simulated
together: a collective starts on a rank when that rank is ready and ends for all its members a transfer time after
the last of them arrived, so waits are real and differ per rank. Each call's `comm:<op>:unit<i>@<group>` start/end
range (payload its bytes) holds its launch; each rank's `ddp.meta` lists its two groups (contract/groups.py)
and its host (`node<g>`: a shard group per machine, so the shard calls stay within a host and the replicate ones
cross hosts).
`ranks` writes only those ranks (one file per host or per rank of the same run: same clock, same world).
`grouped=False` names no group (ranges without `@<group>`, no groups in ddp.meta: a run of the default group
alone); `barrier=True` adds, after the last step, one all-reduce kernel per rank outside every comm range (a
closing barrier, its group not named anywhere).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from contract import (
    ALL_REDUCE,
    BACKWARD,
    FORWARD,
    GROUPS_KEY,
    OPTIMIZER,
    PROFILE,
    REDUCE_SCATTER,
    comm_range,
    group_entry,
    step_range,
)
from tests.support.synthetic import START_END, NsysWriter

US = 1_000
LEAD = 30 * US  # the CPU launches this far ahead of the GPU
COMPUTE_STREAM, COMM_STREAM = 7, 20
RS_KERNEL, AR_KERNEL = "ncclDevKernel_ReduceScatter_Sum_f32_RING_LL", "ncclDevKernel_AllReduce_Sum_f32_RING_LL"
SHARD, REPLICATE = "shard", "replicate"


def members(rank: int, shard: int, replicas: int) -> dict[str, list[int]]:
    """The two groups rank `rank` belongs to: {shard: [...], replicate: [...]}."""
    first = rank // shard * shard
    return {SHARD: list(range(first, first + shard)), REPLICATE: [rank % shard + k * shard for k in range(replicas)]}


def _kernels(rng: np.random.Generator, t0: np.ndarray, n: int, speed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """n back-to-back kernels per rank (rows) from t0, durations 5-20 us times the rank's speed factor."""
    dur = (rng.integers(5 * US, 20 * US, (t0.size, n)) * speed[:, None]).astype(np.int64)
    gap = rng.integers(1 * US, 3 * US, (t0.size, n))
    start = t0[:, None] + np.cumsum(gap + dur, axis=1) - dur
    return start, start + dur


def _collective(arrive: np.ndarray, group_of: np.ndarray, transfer: np.ndarray) -> np.ndarray:
    """Per rank: when its call ends, the latest arrival of its group plus the group's transfer time."""
    last = np.zeros(group_of.max() + 1, dtype=np.int64)
    np.maximum.at(last, group_of, arrive)
    return last[group_of] + transfer[group_of]


def write_hsdp_trace(
    path: str | Path,
    shard: int = 2,
    replicas: int = 2,
    steps: int = 2,
    calls: int = 3,
    forward: int = 6,
    backward: int = 12,
    seed: int = 0,
    ranks: Sequence[int] | None = None,
    grouped: bool = True,
    barrier: bool = False,
) -> Path:
    """Write the export (see the module docstring); returns its path."""
    world = shard * replicas
    rng = np.random.default_rng(seed)
    every = np.arange(world)
    shard_of, replica_of = every // shard, every % shard
    speed = 1.0 + rng.uniform(0.0, 0.6, world)  # each rank its own pace
    w = NsysWriter(path, seed=seed)
    keep = np.isin(every, list(ranks) if ranks is not None else every)
    t = 1_000_000_000 + rng.integers(0, 100 * US, world)
    first = t.copy()
    for r in np.flatnonzero(keep):
        pid = 1000 + 10 * int(r)
        w.process(pid)
        groups = {name: group_entry(m, f"mesh_{name}") for name, m in members(int(r), shard, replicas).items()}
        meta = {"implementation": "hsdp_synthetic", "rank": int(r), "world_size": world, "backend": "nccl"}
        meta["hostname"] = f"node{int(r) // shard}"  # a shard group per machine, replicas across machines
        listed = {GROUPS_KEY: groups} if grouped else {}
        w.meta_mark(pid, pid, int(t[r]) - 2 * LEAD, **meta, device=f"cuda:{r}", **listed)
    for step in range(steps):
        f_s, f_e = _kernels(rng, t, forward, speed)
        b_s, b_e = _kernels(rng, f_e[:, -1], backward, speed)
        after = np.linspace(backward // calls, backward - 1, calls).astype(np.int64)
        free = np.zeros(world, dtype=np.int64)  # the communication stream's end so far
        comm: list[tuple[str, str, int, np.ndarray, np.ndarray, np.ndarray]] = []
        for i in range(calls):  # few calls per step; every rank at once
            ready = np.maximum(b_e[:, after[i]] + 2 * US + rng.integers(0, 20 * US, world), free)
            rs_end = _collective(ready, shard_of, rng.integers(20 * US, 60 * US, shard_of.max() + 1))
            ar_start = rs_end + US + rng.integers(0, 5 * US, world)
            ar_end = _collective(ar_start, replica_of, rng.integers(40 * US, 120 * US, replica_of.max() + 1))
            launch = b_s[:, after[i]] - LEAD + 500
            comm.append((REDUCE_SCATTER, SHARD, i, ready, rs_end, launch))
            comm.append((ALL_REDUCE, REPLICATE, i, ar_start, ar_end, launch + 300))
            free = ar_end + US
        o_s, o_e = _kernels(rng, np.maximum(b_e[:, -1], free) + 5 * US, 3, speed)
        for r in np.flatnonzero(keep):
            _write_rank_step(w, int(r), step, (f_s[r], f_e[r]), (b_s[r], b_e[r]), (o_s[r], o_e[r]), comm, grouped)
        t = o_e[:, -1] + 50 * US
    if barrier:
        arrive = t + rng.integers(0, 20 * US, world)
        end = arrive.max() + 5 * US
        for r in np.flatnonzero(keep):
            w.kernels(
                1000 + 10 * int(r),
                1000 + 10 * int(r),
                int(r),
                COMM_STREAM,
                [arrive[r]],
                [end],
                AR_KERNEL,
                launch=[arrive[r] - LEAD],
            )
        t = np.full(world, end + 50 * US)
    for r in np.flatnonzero(keep):
        pid = 1000 + 10 * int(r)
        w.nvtx(pid, pid, [int(first[r]) - 2 * LEAD + 100], [int(t[r])], PROFILE)
    return w.close()


def _write_rank_step(
    w: NsysWriter, r: int, step: int, fwd: tuple, bwd: tuple, opt: tuple, comm: list, grouped: bool = True
) -> None:
    """One rank's kernels and ranges of one step (nothing random here: any subset of ranks writes the same rows)."""
    pid = 1000 + 10 * r
    names = np.array(["sgemm_128x64_tn", "vectorized_elementwise_kernel", "reduce_kernel"], dtype=object)
    for s, e in (fwd, bwd, opt):
        w.kernels(pid, pid, r, COMPUTE_STREAM, s, e, names[np.arange(s.size) % names.size], launch=s - LEAD)
    for op, group, i, start, end, launch in comm:
        kernel = RS_KERNEL if op == REDUCE_SCATTER else AR_KERNEL
        w.kernels(pid, pid, r, COMM_STREAM, [start[r]], [end[r]], kernel, launch=[launch[r]])
        text = comm_range(op, f"unit{i}", group if grouped else None)
        size = (i + 1) << 20 if op == REDUCE_SCATTER else (i + 1) << 18  # the shard: a quarter of the unit
        end_cpu = max(launch[r] + 1_000, end[r] - LEAD + 1_000)
        w.nvtx(pid, pid, [launch[r] - 200], [end_cpu], text, kind=START_END, payload=[size])
    phases = [
        (FORWARD, fwd[0][0] - LEAD - 500, fwd[0][-1] - LEAD + 500),
        (BACKWARD, bwd[0][0] - LEAD - 500, bwd[0][-1] - LEAD + 1_000),
        (OPTIMIZER, opt[0][0] - LEAD - 500, opt[0][-1] - LEAD + 500),
        (step_range(step), fwd[0][0] - LEAD - 1_000, opt[0][-1] - LEAD + 1_000),
    ]
    w.nvtx(pid, pid, [p[1] for p in phases], [p[2] for p in phases], np.array([p[0] for p in phases], dtype=object))
