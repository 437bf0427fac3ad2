"""Run `worker(ctx, *args)` on every rank: spawn local processes, or join a torchrun job.

    result = launch(worker, world_size=2)          # spawns 2 ranks, returns rank 0's result
    torchrun --nproc-per-node 4 -m ddp.benchmark   # RANK/WORLD_SIZE/LOCAL_RANK set: join it

A rank that raises or dies brings the others down: the parent kills the survivors and raises
RankFailedError naming the rank and its error, instead of waiting on a collective forever. A parent
that is killed takes its ranks with it (`_end_with_parent`): nothing else would stop them.
A collective that never completes ends the job too, named with the rank that never reached it: ranks
mirror their position (`ddp.comm.inflight`) into shared memory, a backend's timeout (the process-group
timeout, DDP_TIMEOUT_S) is reported with it, and past that timeout the parent stops the job itself
(the parent's side of both is `ddp.launch.rank_failures`). More local ranks than GPUs with NCCL is checked
against the loaded NCCL first (`ddp.launch.gpu_sharing`).
"""

from __future__ import annotations

import ctypes
import os
import pickle
import signal
import socket
import sys
import time
import traceback
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing.queues import Queue
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from contract import RUN_ID_ENV
from ddp.comm import inflight
from ddp.launch import gpu_sharing
from ddp.launch.rank_failures import (
    RankFailedError as RankFailedError,  # raised by launch: importable from here
    collect,
    failure_message,
)

DEFAULT_TIMEOUT_S = 300.0  # a collective waiting longer than this fails instead of hanging
TIMEOUT_ENV = "DDP_TIMEOUT_S"  # overrides DEFAULT_TIMEOUT_S for every CLI
JOIN_TIMEOUT_S = 120.0  # how long spawned ranks wait for each other to start, at least (a dead one ends it sooner)
_PR_SET_PDEATHSIG = 1  # prctl(2): the signal this process gets when its parent dies


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


def run_id(env: Mapping[str, str] | None = None) -> str | None:
    """This run's id, the same on every rank (ddp.meta's run_id): the one `launch` handed its ranks, else
    torchrun's rendezvous id (a uuid with --standalone), else None."""
    said: Mapping[str, str] = os.environ if env is None else env
    rendezvous = said.get("TORCHELASTIC_RUN_ID", "")
    return said.get(RUN_ID_ENV) or (rendezvous if rendezvous not in ("", "none") else None)


def in_torchrun() -> bool:
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_count() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def default_timeout_s(env: dict[str, str] | None = None) -> float:
    """$DDP_TIMEOUT_S if set (seconds > 0), else DEFAULT_TIMEOUT_S."""
    value = (os.environ if env is None else env).get(TIMEOUT_ENV, "")
    if not value:
        return DEFAULT_TIMEOUT_S
    try:
        seconds = float(value)
    except ValueError:
        seconds = 0.0
    if not seconds > 0:
        raise ValueError(f"{TIMEOUT_ENV}={value!r}: must be a number of seconds > 0")
    return seconds


def choose_backend(local_world_size: int, requested: str | None = None, share_gpus: bool = False) -> str:
    """nccl when each local rank can have its own GPU (or --share-gpus), else gloo; `requested` wins if usable."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if requested is None:
        enough = gpus >= local_world_size or (share_gpus and gpus > 0)
        return "nccl" if enough and dist.is_nccl_available() else "gloo"
    if requested not in ("gloo", "nccl"):
        raise ValueError(f"unknown backend {requested!r}: choose gloo or nccl")
    if requested == "nccl" and gpus == 0:
        raise ValueError("backend nccl needs a CUDA GPU, and none is visible: use gloo")
    return requested


def sharing_plan(backend: str, local_world_size: int, share_gpus: bool) -> gpu_sharing.SharingPlan:
    """Check more local ranks than GPUs against the NCCL library this process loaded (ValueError if refused)."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    nccl = gpu_sharing.loaded_nccl() if backend == "nccl" and local_world_size > gpus > 0 else None
    return gpu_sharing.plan_sharing(
        backend,
        local_world_size,
        gpus,
        nccl,
        share_gpus,
        os.environ.get(gpu_sharing.ENABLE_VAR) == "1",
        gpu_sharing.mps_running(),
    )


def _setup_rank(
    rank: int,
    local_rank: int,
    world_size: int,
    local_world_size: int,
    backend: str,
    timeout_s: float,
    store_at: tuple[str, int] | None = None,
) -> DistContext:
    """Join the process group: through a TCP store at `store_at` (host, port; rank 0 serves it) for
    the ranks `launch` spawns, else as torchrun set the environment (env://)."""
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
        # Ranks on one machine share its cores: more threads than cores makes every rank slower.
        torch.set_num_threads(max(1, cpu_count() // local_world_size))
    timeout = timedelta(seconds=timeout_s)
    if store_at is None:  # torchrun's agent has gathered the ranks already
        dist.init_process_group(backend, init_method="env://", rank=rank, world_size=world_size, timeout=timeout)
    else:
        # joining waits for every rank to start (spawn, import torch: seconds on a loaded machine), which is not
        # a collective: a short collective timeout must not fail ranks that start slowly
        join = timedelta(seconds=max(timeout_s, JOIN_TIMEOUT_S))
        store = dist.TCPStore(*store_at, world_size, is_master=rank == 0, timeout=join)
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout)
    return DistContext(rank, local_rank, world_size, local_world_size, backend, device)


def _end_with_parent(parent: int) -> None:
    """Have the kernel kill this rank when its parent dies (Linux; elsewhere nothing changes). A parent
    killed outright (SIGKILL, or SIGTERM at its default: what a stopped recording does) never runs the
    clean-up that stops its ranks, and orphaned ranks would train on until their last step, past the
    recording's own timeout."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # it died before the line above
        os._exit(1)


def _child(
    rank: int,
    world_size: int,
    backend: str,
    store_at: tuple[str, int],
    timeout_s: float,
    worker: Callable[..., Any],
    args: tuple[Any, ...],
    results: Queue[Any],
    slots: ctypes.Array[inflight.Slot] | None = None,
    env: dict[str, str] | None = None,
    parent: int | None = None,
) -> None:
    """Body of one spawned rank: report ("ok", result) or ("error", when, message, traceback)."""
    if parent is not None:
        _end_with_parent(parent)
    try:
        os.environ.update(env or {})
        inflight.attach(slots[rank] if slots is not None else None)
        ctx = _setup_rank(rank, rank, world_size, world_size, backend, timeout_s, store_at)
        result = worker(ctx, *args)
        # Plain pickle copies tensors by value; torch's queue pickler would pass shared-memory handles
        # that vanish when this process exits before the parent reads them.
        results.put((rank, "ok", pickle.dumps(result if rank == 0 else None)))
        dist.destroy_process_group()
    except BaseException as exc:  # everything must reach the parent
        results.put((rank, "error", (time.time(), failure_message(exc), traceback.format_exc())))
        results.close()
        results.join_thread()
        os._exit(1)  # skip destroy_process_group: peers may be gone, and it could wait on them


def launch(
    worker: Callable[..., Any],
    world_size: int | None = None,
    *args: Any,
    backend: str | None = None,
    timeout_s: float | None = None,
    share_gpus: bool = False,
) -> Any:
    """Run `worker(ctx, *args)` on every rank and return rank 0's result (this rank's under torchrun).

    `worker` must be a module-level function (spawned ranks import it). `timeout_s`: how long a
    collective may wait (default $DDP_TIMEOUT_S, else 300 s). `share_gpus`: let NCCL (>= 2.30) put
    several ranks on one GPU. Raises RankFailedError when a rank fails or a collective never completes,
    ValueError for a bad world size or backend, or more ranks than GPUs that NCCL would refuse.
    """
    timeout_s = default_timeout_s() if timeout_s is None else timeout_s
    if in_torchrun():
        return _run_in_torchrun(worker, world_size, args, backend, timeout_s, share_gpus)
    world_size = 2 if world_size is None else world_size
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world size must be a positive integer, got {world_size!r}")
    backend = choose_backend(world_size, backend, share_gpus)
    sharing = sharing_plan(backend, world_size, share_gpus)
    if sharing.note:
        print(f"[ddp] {sharing.note}", file=sys.stderr, flush=True)
    addr = os.environ.get("MASTER_ADDR", "127.0.0.1")
    port = int(os.environ["MASTER_PORT"]) if os.environ.get("MASTER_PORT") else free_port()
    env = {**sharing.env, RUN_ID_ENV: os.environ.get(RUN_ID_ENV) or uuid.uuid4().hex}  # one id for this run's ranks
    spawn = mp.get_context("spawn")
    results = spawn.Queue()
    slots = spawn.RawArray(inflight.Slot, world_size)
    procs = [
        spawn.Process(
            target=_child,
            daemon=True,
            args=(r, world_size, backend, (addr, port), timeout_s, worker, args, results, slots, env, os.getpid()),
        )
        for r in range(world_size)
    ]
    for p in procs:
        p.start()
    try:
        return collect(procs, results, slots, timeout_s)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
        for p in procs:
            p.join(timeout=10)


def _run_in_torchrun(
    worker: Callable[..., Any],
    world_size: int | None,
    args: tuple[Any, ...],
    backend: str | None,
    timeout_s: float,
    share_gpus: bool = False,
) -> Any:
    """This process is one rank of a torchrun job: a failure becomes RankFailedError naming this rank
    (torchrun then stops the others)."""
    env_world = int(os.environ["WORLD_SIZE"])
    if world_size is not None and world_size != env_world:
        raise ValueError(f"world size {world_size} does not match torchrun's WORLD_SIZE={env_world}")
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", env_world))
    rank = int(os.environ["RANK"])
    backend = choose_backend(local_world, backend, share_gpus)
    sharing = sharing_plan(backend, local_world, share_gpus)
    os.environ.update(sharing.env)
    if sharing.note and int(os.environ["LOCAL_RANK"]) == 0:
        print(f"[ddp] {sharing.note}", file=sys.stderr, flush=True)
    try:
        ctx = _setup_rank(rank, int(os.environ["LOCAL_RANK"]), env_world, local_world, backend, timeout_s)
    except RuntimeError as exc:  # DistError is a RuntimeError
        raise RankFailedError(f"rank {rank} failed: {failure_message(exc)}", traceback.format_exc()) from None
    try:
        return worker(ctx, *args)
    except RuntimeError as exc:
        raise RankFailedError(f"rank {rank} failed: {failure_message(exc)}", traceback.format_exc()) from None
    finally:
        dist.destroy_process_group()
