"""Run `worker(ctx, *args)` on every rank: spawn local processes, or join a torchrun job.

    result = launch(worker, world_size=2)          # spawns 2 ranks, returns rank 0's result
    torchrun --nproc-per-node 4 -m ddp.benchmark   # RANK/WORLD_SIZE/LOCAL_RANK set: join it

A rank that raises or dies brings the others down: the parent kills the survivors and raises
RankFailedError naming the rank and its error, instead of waiting on a collective forever.
"""
from __future__ import annotations

import os
import pickle
import queue as queue_module
import socket
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

DEFAULT_TIMEOUT_S = 300.0  # a collective waiting longer than this fails instead of hanging
GRACE_S = 1.0  # after a first failure, how long to collect the others before picking the root cause


@dataclass(frozen=True)
class DistContext:
    """Where this rank runs."""
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    backend: str
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


class RankFailedError(RuntimeError):
    """A rank raised or died; `str()` is one line, `details` holds the rank's traceback if any."""

    def __init__(self, message: str, details: str = ""):
        super().__init__(message)
        self.details = details


def in_torchrun() -> bool:
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_count() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def choose_backend(local_world_size: int, requested: str | None = None) -> str:
    """nccl when each local rank can have its own GPU, else gloo; `requested` wins if usable."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if requested is None:
        return "nccl" if gpus >= local_world_size and dist.is_nccl_available() else "gloo"
    if requested not in ("gloo", "nccl"):
        raise ValueError(f"unknown backend {requested!r}: choose gloo or nccl")
    if requested == "nccl" and gpus == 0:
        raise ValueError("backend nccl needs a CUDA GPU, and none is visible: use gloo")
    return requested


def _setup_rank(rank: int, local_rank: int, world_size: int, local_world_size: int, backend: str,
                init_method: str, timeout_s: float) -> DistContext:
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
        # Ranks on one machine share its cores: more threads than cores makes every rank slower.
        torch.set_num_threads(max(1, cpu_count() // local_world_size))
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=timeout_s))
    return DistContext(rank, local_rank, world_size, local_world_size, backend, device)


def _child(rank: int, world_size: int, backend: str, init_method: str, timeout_s: float,
           worker: Callable, args: tuple, results) -> None:
    """Body of one spawned rank: report ("ok", result) or ("error", when, message, traceback)."""
    try:
        ctx = _setup_rank(rank, rank, world_size, world_size, backend, init_method, timeout_s)
        result = worker(ctx, *args)
        # Plain pickle copies tensors by value; torch's queue pickler would pass shared-memory handles
        # that vanish when this process exits before the parent reads them.
        results.put((rank, "ok", pickle.dumps(result if rank == 0 else None)))
        dist.destroy_process_group()
    except BaseException as exc:  # noqa: BLE001 - everything must reach the parent
        message = f"{type(exc).__name__}: {exc}".splitlines()[0] if str(exc) else type(exc).__name__
        results.put((rank, "error", (time.time(), message, traceback.format_exc())))
        results.close()
        results.join_thread()
        os._exit(1)  # skip destroy_process_group: peers may be gone, and it could wait on them


def launch(worker: Callable[..., Any], world_size: int | None = None, *args, backend: str | None = None,
           timeout_s: float = DEFAULT_TIMEOUT_S) -> Any:
    """Run `worker(ctx, *args)` on every rank and return rank 0's result (this rank's under torchrun).

    `worker` must be a module-level function (spawned ranks import it). Raises RankFailedError when
    a rank fails, ValueError for a bad world size or backend.
    """
    if in_torchrun():
        return _run_in_torchrun(worker, world_size, args, backend, timeout_s)
    world_size = 2 if world_size is None else world_size
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world size must be a positive integer, got {world_size!r}")
    backend = choose_backend(world_size, backend)
    addr = os.environ.get("MASTER_ADDR", "127.0.0.1")
    port = int(os.environ["MASTER_PORT"]) if os.environ.get("MASTER_PORT") else free_port()
    spawn = mp.get_context("spawn")
    results = spawn.Queue()
    procs = [spawn.Process(target=_child, daemon=True,
                           args=(r, world_size, backend, f"tcp://{addr}:{port}", timeout_s, worker, args, results))
             for r in range(world_size)]
    for p in procs:
        p.start()
    try:
        return _collect(procs, results)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
        for p in procs:
            p.join(timeout=10)


def _collect(procs: list, results) -> Any:
    """Wait for every rank's report; on a failure, pick the root cause and raise it."""
    ok: dict[int, Any] = {}
    errors: dict[int, tuple[float, str, str]] = {}
    first_failure_at: float | None = None
    while len(ok) < len(procs):
        try:
            rank, status, payload = results.get(timeout=0.1)
            if status == "ok":
                ok[rank] = pickle.loads(payload)
            else:
                errors[rank] = payload
        except queue_module.Empty:
            pass
        silent = {r: p.exitcode for r, p in enumerate(procs)
                  if p.exitcode is not None and r not in errors and r not in ok}
        # A rank that exited cleanly may still have its report in the queue: it only counts as silent
        # while that lasts, so the grace period restarts whenever nothing is wrong any more.
        if not (errors or silent):
            first_failure_at = None
        elif first_failure_at is None:
            first_failure_at = time.monotonic()
        if first_failure_at is not None and time.monotonic() - first_failure_at >= GRACE_S:
            _raise_root_cause(errors, silent)
    return ok[0]


def _raise_root_cause(errors: dict[int, tuple[float, str, str]], silent: dict[int, int]) -> None:
    """A rank that died without a word caused the rest; otherwise the earliest error did."""
    if silent:
        rank, code = min(silent.items())
        how = (f"was killed by signal {-code}" if code < 0 else f"exited with code {code}" if code
               else "exited with code 0")
        raise RankFailedError(f"rank {rank} {how} without reporting a result; the other ranks were stopped")
    rank, (_, message, details) = min(errors.items(), key=lambda item: item[1][0])
    raise RankFailedError(f"rank {rank} failed: {message}", details)


def _run_in_torchrun(worker: Callable, world_size: int | None, args: tuple, backend: str | None,
                     timeout_s: float) -> Any:
    env_world = int(os.environ["WORLD_SIZE"])
    if world_size is not None and world_size != env_world:
        raise ValueError(f"world size {world_size} does not match torchrun's WORLD_SIZE={env_world}")
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", env_world))
    ctx = _setup_rank(int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"]), env_world, local_world,
                      choose_backend(local_world, backend), "env://", timeout_s)
    try:
        return worker(ctx, *args)
    finally:
        dist.destroy_process_group()
