"""The per-file tasks of pool.run_tasks on a Dask cluster: `run_dask(fn, items, address, jobs, tick)`.

`address` is a scheduler's (tcp://host:8786), or "local" for a LocalCluster of `jobs` one-thread
worker processes started here. The client first checks that a worker joined and that the scheduler
and the workers import the task's module; outcomes come back in input order, a task's exception or
a dead worker as that item's one-line error, as in the process pool.
"""

from __future__ import annotations

import ctypes
import importlib
import os
from collections.abc import Callable, Sequence
from typing import Any, cast

from analysis.errors import TraceError
from analysis.parallel.tasks import Outcome, call_task, failure_line

DASK_CONNECT_TIMEOUT = "20s"
# With the dashboard off, a local scheduler still serves HTTP (health routes) on 8787 and warns when another
# cluster holds that port: a free port instead, and no dashboard.
LOCAL_SCHEDULER = {"dashboard_address": ":0"}
# A LocalCluster's workers (--dask local) without two of distributed's defaults that slow these tasks:
# MALLOC_TRIM_THRESHOLD_=65536 in the workers' environment also fixes glibc's mmap threshold at
# 128 KiB, so every array of a file's frames is mmapped and faulted in anew (a 1M-kernel file: 2.1
# instead of 1.3 s CPU), and the sampling profiler thread takes the GIL every 10 ms. Workers of a
# cluster given by address keep their own settings (docs/scale.md says how to start them).
LOCAL_DASK_CONFIG = {
    "distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": None,
    "distributed.worker.profile.enabled": False,
}
# mallopt parameters (malloc.h) and the largest mmap threshold glibc's dynamic default reaches (64-bit)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
DYNAMIC_MMAP_THRESHOLD_MAX = 32 * 2**20


MISSING_EXTRA = (
    "--dask needs the optional dask extra, which is not installed: pip install 'ddp-overlap[dask]' "
    "(in a checkout: pip install -e '.[dask]')"
)


def _import_dask() -> tuple[Any, Any]:
    """The dask and distributed modules; a TraceError naming the extra to install when either is missing.
    Every use of distributed in this module goes through here, so a missing extra is never a traceback."""
    try:
        import dask
        import distributed
    except ImportError:
        raise TraceError(MISSING_EXTRA) from None
    return dask, distributed


def _dask_client(address: str, jobs: int) -> tuple[Any, Any]:
    """A distributed.Client for `address`, or for a new LocalCluster of `jobs` one-thread workers when
    the address is "local"; a missing extra or an unreachable scheduler is a TraceError."""
    dask, distributed = _import_dask()
    Client, LocalCluster = distributed.Client, distributed.LocalCluster
    try:
        if address == "local":
            with dask.config.set(LOCAL_DASK_CONFIG):
                cluster = LocalCluster(
                    n_workers=jobs,
                    threads_per_worker=1,
                    processes=True,
                    dashboard_address=None,
                    scheduler_kwargs=LOCAL_SCHEDULER,
                )
            return Client(cluster), cluster
        return Client(address, timeout=DASK_CONNECT_TIMEOUT), None
    except (OSError, TimeoutError, ValueError) as e:
        raise TraceError(f"--dask {address}: cannot reach the Dask scheduler ({type(e).__name__}: {e})") from None


def _check_workers(client: Any, address: str, fn: Callable) -> None:
    """At least one worker, and the scheduler (it unpickles the tasks) and every worker can import the
    task's module and this one (else each task would fail alike, or wait for a worker forever)."""
    try:
        client.wait_for_workers(1, timeout=DASK_CONNECT_TIMEOUT)
    except (TimeoutError, OSError):
        raise TraceError(f"--dask {address}: no Dask worker joined within {DASK_CONNECT_TIMEOUT}") from None
    for module in (__name__, getattr(fn, "func", fn).__module__):
        for where, run in (("the scheduler", client.run_on_scheduler), ("a worker", client.run)):
            try:
                run(importlib.import_module, module)
            except Exception as e:
                raise TraceError(
                    f"--dask {address}: {where} cannot import {module} ({type(e).__name__}: {e}); "
                    "install this project where the scheduler and workers run (pip install -e .) or "
                    "start them with PYTHONPATH=<this checkout>"
                ) from None


def undo_fixed_trim_threshold() -> bool:
    """In a process started with MALLOC_TRIM_THRESHOLD_ set (the workers of a Dask nanny, by
    default), set glibc's thresholds to where its dynamic default ends up (mmap 32 MiB, trim twice
    that): the variable also fixes the mmap threshold at 128 KiB, so every array of a file's frames
    would be mmapped and faulted in anew (a 1M-kernel file: 2.1 instead of 1.3 s CPU). Returns
    whether it changed them (not without the variable or outside glibc)."""
    if not os.environ.get("MALLOC_TRIM_THRESHOLD_"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    mmap = libc.mallopt(M_MMAP_THRESHOLD, DYNAMIC_MMAP_THRESHOLD_MAX)
    return bool(mmap and libc.mallopt(M_TRIM_THRESHOLD, 2 * DYNAMIC_MMAP_THRESHOLD_MAX))


def _call_on_dask(fn: Callable, item: Any) -> Outcome:
    undo_fixed_trim_threshold()  # a cluster given by address may start its workers with distributed's defaults
    return call_task(fn, item)


def run_dask(fn: Callable, items: Sequence, address: str, jobs: int, tick: Callable[[Outcome], None]) -> list[Outcome]:
    as_completed = _import_dask()[1].as_completed
    client, cluster = _dask_client(address, jobs)
    try:
        _check_workers(client, address, fn)
        futures = client.map(_call_on_dask, [fn] * len(items), list(items), pure=False)
        index = {f.key: i for i, f in enumerate(futures)}
        results: list[Outcome | None] = [None] * len(items)
        for future in as_completed(futures):
            i = index[future.key]
            try:
                outcome = future.result()
            except Exception as e:  # the worker died (KilledWorker) or the task could not be shipped
                outcome = Outcome(items[i], error=failure_line(items[i], e))
            results[i] = outcome
            tick(outcome)
        return cast(list[Outcome], results)
    finally:
        client.close()
        if cluster is not None:
            cluster.close()
