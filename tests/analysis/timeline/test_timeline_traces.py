"""Small nsys-schema SQLite exports for the timeline and report tests.

Each rank runs `steps` steps of 100 ms: forward 0-30, backward 30-70, grad_sync 70-80, optimizer
80-90 (ms into the step). Compute kernels fill forward/backward/optimizer. `naive` communicates
after backward (no overlap); `overlap` issues three async all-reduces during backward that end on
another thread (their GPU kernels run under the backward's compute). `gpu=False` writes only NVTX
tables, like the CPU-only traces this machine records.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

MS = 1_000_000
MAIN_TID, WORKER_TID = 1, 2


def gtid(pid: int, tid: int) -> int:
    """nsys globalTid: <HW:8><VM:8><PID:24><TID:24>."""
    return (pid << 24) | tid


def _comm_windows(kind: str) -> list[tuple[int, int]]:
    """Communication (start, end) in ms into the step."""
    if kind == "naive":
        return [(70, 79)]
    if kind == "overlap":
        return [(40, 48), (55, 63), (70, 76)]
    raise ValueError(f"kind={kind!r}: expected naive or overlap")


def write_trace(path: Path, kind: str, ranks: int = 2, steps: int = 3, gpu: bool = True, first_rank: int = 0) -> Path:
    """Write a synthetic export at `path` (ranks first_rank.. first_rank + ranks - 1) and return it."""
    nvtx, kernels, runtime, strings = [], [], [], {"gemm": 1, "ncclDevKernel_AllReduce_Sum_f32": 2}
    corr = 0
    for r in range(first_rank, first_rank + ranks):
        pid = 100 + r
        main, worker = gtid(pid, pid * 10 + MAIN_TID), gtid(pid, pid * 10 + WORKER_TID)
        nvtx.append((0, 0, 34, f'ddp.meta {{"implementation": "{kind}", "rank": {r}}}', main, None))
        for k in range(steps):
            t0 = (k * 100 + 5) * MS + r * 200_000  # ranks slightly skewed
            for name, a, b in (
                (f"step {k}", 0, 90),
                ("forward", 0, 30),
                ("backward", 30, 70),
                ("grad_sync", 70, 80),
                ("optimizer", 80, 90),
            ):
                nvtx.append((t0 + a * MS, t0 + b * MS, 59, name, main, None))
            for i, (a, b) in enumerate(_comm_windows(kind)):
                text = f"comm:all_reduce:bucket{i}"
                if kind == "naive":
                    nvtx.append((t0 + a * MS, t0 + b * MS, 59, text, main, None))
                else:  # async: issued on the main thread, completed by the worker
                    nvtx.append((t0 + a * MS, t0 + b * MS, 60, text, main, worker))
                corr += 1
                kernels.append((t0 + a * MS + 50_000, t0 + b * MS, r, 13, corr, pid << 24, 2))
                runtime.append((t0 + a * MS, t0 + a * MS + 20_000, main, corr))
            for a, b in ((0, 30), (30, 70), (80, 90)):
                for t in range(a, b):
                    corr += 1
                    kernels.append((t0 + t * MS + 100_000, t0 + t * MS + 700_000, r, 7, corr, pid << 24, 1))
                    runtime.append((t0 + t * MS, t0 + t * MS + 10_000, main, corr))
    path = Path(path)
    path.unlink(missing_ok=True)
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL)")
        db.executemany("INSERT INTO StringIds VALUES (?, ?)", [(i, s) for s, i in strings.items()])
        db.execute(
            "CREATE TABLE NVTX_EVENTS (start INTEGER NOT NULL, end INTEGER, eventType INTEGER NOT NULL,"
            " text TEXT, globalTid INTEGER, endGlobalTid INTEGER, domainId INTEGER, textId INTEGER)"
        )
        db.executemany("INSERT INTO NVTX_EVENTS VALUES (?, ?, ?, ?, ?, ?, 0, NULL)", nvtx)
        if gpu:
            db.execute(
                "CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER NOT NULL, end INTEGER NOT NULL,"
                " deviceId INTEGER, streamId INTEGER, correlationId INTEGER, globalPid INTEGER,"
                " shortName INTEGER)"
            )
            db.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?, ?, ?, ?, ?, ?, ?)", kernels)
            db.execute(
                "CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INTEGER NOT NULL, end INTEGER NOT NULL,"
                " globalTid INTEGER, correlationId INTEGER)"
            )
            db.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?, ?, ?, ?)", runtime)
    return path


def test_the_synthetic_exports_load_as_two_rank_traces(tmp_path):
    from analysis.run.loaded_run import load_trace

    gpu = load_trace(write_trace(tmp_path / "overlap.sqlite", "overlap"))
    assert gpu.source == "kernels" and gpu.ranks["rank"].tolist() == [0, 1]
    assert gpu.implementation == "overlap"
    assert int(gpu.gpu_ops["is_comm"].sum()) == 2 * 3 * 3
    cpu = load_trace(write_trace(tmp_path / "naive.sqlite", "naive", gpu=False))
    assert cpu.source == "ranges" and len(cpu.ranks) == 2 and len(cpu.gpu_ops) == 0
