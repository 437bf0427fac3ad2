"""Run one function over many trace files: in this process, a local process pool, or a Dask cluster.

    outcomes = run_tasks(fn, items, jobs=4)            # or dask="tcp://scheduler:8786" / dask="local"

Each item is analysed independently (`fn(item)` must be a top-level function, or a partial of one,
so it pickles); outcomes come back in input order whatever the completion order, each holding the
value or a one-line error (an Outcome, the same from the serial loop, the pool and Dask), so one
bad file never stops the others. Memory stays per task: a worker holds one file's frames at a time
and only the small result frames travel back.
"""

from __future__ import annotations

import multiprocessing
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import cast

from analysis.machine import available_memory, usable_cores
from analysis.options import check_jobs
from analysis.parallel.tasks import Outcome, call_task

# Peak RSS of one analysis is a fixed ~0.2 GB (interpreter, pandas, pyarrow) plus about 2.5x the
# export's size on disk (a one-rank export of 1M kernels, 102 MB, in benchmarks/analysis_scale.py:
# 0.47 GB in a pool worker, 0.55 GB in a Dask worker); the estimate below keeps a margin (0.56 GB).
BASE_RSS_BYTES = 200 * 2**20
RSS_PER_FILE_BYTE = 3.5
MEMORY_SHARE = 0.8  # leave a fifth of the available memory to everything else
PROGRESS_AFTER_S = 3.0  # stay quiet for runs shorter than this
PROGRESS_EVERY_S = 2.0
WORKER_RETRIES = 1  # items in flight when a worker process dies are run once more in a new pool
# A new pool (new workers) for every jobs x TASKS_PER_WORKER items, about this many tasks per worker:
# connectorx leaves idle threads behind after every read (trace/readers/sqlite_read.py), so a worker that
# read hundreds of files would hold thousands. Workers fork from the one fork server: a new pool is cheap.
TASKS_PER_WORKER = 64
# imported once by the fork server and inherited by every worker; not our own modules: a worker
# re-runs the CLI's main module (`python -m analysis.overlap`), which must not be imported before
PRELOAD = ["numpy", "pandas", "pyarrow", "connectorx", "sqlite3"]


class Progress:
    """'files done / total, rate, ETA' lines on stderr, at most every PROGRESS_EVERY_S seconds and only
    once the run has lasted PROGRESS_AFTER_S (or always, with after_s=0). Failures are counted here;
    their messages are the caller's to print at the end, where they are not lost among these lines."""

    def __init__(
        self, total: int, prefix: str, after_s: float | None = None, write: Callable[[str], object] | None = None
    ):
        self.total, self.prefix, self.done, self.failed = total, prefix, 0, 0
        self.after_s = PROGRESS_AFTER_S if after_s is None else after_s
        self.write = write or (lambda line: print(line, file=sys.stderr, flush=True))
        self.started = time.perf_counter()
        self.last: float | None = None

    def tick(self, outcome: Outcome) -> None:
        self.done += 1
        self.failed += not outcome.ok
        now = time.perf_counter()
        due = self.last is None or now - self.last >= PROGRESS_EVERY_S or self.done == self.total
        if now - self.started >= self.after_s and due:
            self.last = now
            self.write(f"{self.prefix} {self.line(now)}".strip())

    def line(self, now: float) -> str:
        elapsed = now - self.started
        rate = self.done / elapsed if elapsed > 0 else 0.0
        eta = (self.total - self.done) / rate if rate > 0 else float("nan")
        failed = f", {self.failed} failed" if self.failed else ""
        return (
            f"{self.done}/{self.total} files done{failed}, {rate:.2f} files/s, elapsed {elapsed:.1f} s, ETA {eta:.1f} s"
        )


def task_memory(paths: Sequence[Path]) -> int:
    """Estimated peak RSS of one worker: the fixed cost plus the largest export's share."""
    sizes = [Path(p).stat().st_size for p in paths if Path(p).is_file()]
    return int(BASE_RSS_BYTES + RSS_PER_FILE_BYTE * max(sizes, default=0))


SMALL_INPUT_BYTES = 64 * 2**20  # below this in all, starting worker processes costs more than it saves


def default_jobs(paths: Sequence[Path]) -> int:
    """min(usable cores, files, workers whose estimated peak RSS fits in MEMORY_SHARE of the available
    memory); 1 for inputs under SMALL_INPUT_BYTES in all."""
    sizes = [Path(p).stat().st_size for p in paths if Path(p).is_file()]
    if sum(sizes) < SMALL_INPUT_BYTES:
        return 1
    jobs = min(usable_cores(), len(paths))
    memory = available_memory()
    if memory is not None:
        jobs = min(jobs, int(MEMORY_SHARE * memory // task_memory(paths)))
    return max(1, jobs)


def run_tasks(
    fn: Callable, items: Sequence, jobs: int = 1, dask: str | None = None, progress: Progress | None = None
) -> list[Outcome]:
    """fn(item) for every item, in order of the items; serial in this process when jobs == 1 and no
    dask address, else in a pool of `jobs` processes or on the Dask cluster at `dask`."""
    check_jobs(jobs)
    tick = progress.tick if progress else (lambda outcome: None)
    if dask:
        from analysis.parallel.dask_run import run_dask  # deferred: distributed is an optional extra

        return run_dask(fn, items, dask, jobs, tick)
    if jobs == 1 or len(items) <= 1:
        out = []
        for item in items:
            out.append(call_task(fn, item))
            tick(out[-1])
        return out
    try:
        return _run_pool(fn, items, jobs, tick)
    finally:
        stop_helpers()


def stop_helpers(tracker: bool = False) -> None:
    """Stop the fork server the pools' workers forked from, and with `tracker` multiprocessing's resource
    tracker, and wait for them: left running they (and a worker the fork server has not reaped yet)
    outlive the pool until the interpreter exits, so a caller timing the command would not see their
    CPU and memory. Either starts again when a later pool needs it. Only when this process has no other
    multiprocessing child (one holding their pipes would keep them alive, and the wait would hang).
    The tracker is for the CLIs at their end (cli.run): stopped in a library call it would unlink the
    caller's own semaphores; a command that started no tracker (no pool ran) skips it and the collection
    before it (about 0.03 s with a 1M-kernel run loaded). Uses multiprocessing's own stop methods (what
    its tests call); a Python without them keeps its helpers until exit, as before."""
    import gc
    from multiprocessing import active_children, forkserver, resource_tracker

    if active_children():
        return
    helpers = [getattr(forkserver, "_forkserver", None)]
    running = getattr(resource_tracker, "_resource_tracker", None)
    if tracker and getattr(running, "_pid", True) is not None:  # None: never started, so nothing to stop
        gc.collect()  # the pools' semaphores unregister from the tracker when collected: before it stops
        helpers.append(running)
    for helper in helpers:
        stop = getattr(helper, "_stop", None)
        if callable(stop):
            stop()


def _pool(jobs: int) -> ProcessPoolExecutor:
    # forkserver: workers fork from a clean server that imported the analysis once, not from this
    # (possibly threaded) process; fork-after-threads can deadlock in Arrow/connectorx.
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)
    return ProcessPoolExecutor(max_workers=jobs, mp_context=context)


def _run_pool(fn: Callable, items: Sequence, jobs: int, tick: Callable[[Outcome], None]) -> list[Outcome]:
    results: list[Outcome | None] = [None] * len(items)
    attempts = [0] * len(items)
    fresh = list(range(len(items)))  # not run yet: in rounds of jobs x TASKS_PER_WORKER, a new pool each
    again: list[int] = []  # in flight when a worker died: run once more at the end, one at a time
    while fresh or again:
        alone = not fresh  # a retry runs alone: a file that kills its worker again breaks no other's try
        batch = again[:1] if alone else fresh[: jobs * TASKS_PER_WORKER]
        if alone:
            again = again[1:]
        else:
            fresh = fresh[len(batch) :]
        with _pool(1 if alone else min(jobs, len(batch))) as pool:
            running = {pool.submit(call_task, fn, items[i]): i for i in batch}
            while running:
                finished, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in finished:
                    i = running.pop(future)
                    try:
                        outcome = future.result()
                    except BrokenProcessPool:  # a worker was killed (OOM killer, signal): retry once
                        attempts[i] += 1
                        if attempts[i] <= WORKER_RETRIES:
                            again.append(i)
                            continue
                        outcome = Outcome(
                            items[i],
                            error=f"{items[i]}: the worker process analysing it died (out of memory? see dmesg)",
                        )
                    results[i] = outcome
                    tick(outcome)
        again.sort()
    return cast(list[Outcome], results)  # every item has its outcome now
