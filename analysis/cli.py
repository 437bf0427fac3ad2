"""What every analysis CLI shares: the input options (the same names and metavars everywhere), opening
the runs they name (api.open_runs: a session.OpenRuns), the one error-to-exit-code path, output
to a closed pipe.

Exit status: 0 ok, 2 bad input (one line on stderr, never a traceback).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import replace
from importlib import import_module
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from analysis.cache.key import cache_off
from analysis.errors import TraceError
from analysis.options import INPUTS, PATTERNS, TRACE_HELP, AnalysisOptions, add_options
from analysis.trace.patterns import Patterns

if TYPE_CHECKING:
    from analysis.session import OpenRuns, RunResult
    from analysis.trace.readers.read import StartedRead

EXIT_STATUS = "Exit status: 0 ok, 2 bad input (one line on stderr: error: ...)."


def add_input_options(parser: argparse.ArgumentParser, what: str = "one result each") -> None:
    """TRACE..., --merge, --export, --skip-steps, --step, --rank, --jobs, --dask and the pattern
    options (declared in analysis/options.py): what every analysis CLI reads its runs with."""
    add_options(parser, [*INPUTS, *PATTERNS], helps={"paths": f"{TRACE_HELP}; runs give {what}"})


def open_from_args(
    args: argparse.Namespace,
    prefix: str,
    *,
    task: Callable | None = None,
    keep_traces: bool = True,
    needs_events: bool = False,
    overlap_detail: bool = True,
) -> OpenRuns:
    """api.open_runs of the runs the input options name, with progress lines on stderr for inputs of
    more than 200 MB (or any input analysed file by file). needs_events: the command draws or pairs
    the runs' events (collectives, timeline, report), so without --jobs/--dask each run is read once
    in this process rather than analysed file by file and read again for its events; overlap_detail=False:
    the command shows neither by_op_phase nor across_ranks (session.OpenRuns)."""
    from analysis.parallel.pool import Progress, default_jobs
    from analysis.run.run_files import find_runs

    opts = AnalysisOptions.from_args(args)  # a bad --jobs, --step, --rank or --skip-steps: named here
    runs = find_runs(opts.paths, opts.merge, opts.export)
    files = [p for r in runs for p in r.paths]
    big = sum(p.stat().st_size for p in files if p.is_file()) > 200 * 2**20
    progress = Progress(len(files), prefix, after_s=0 if big else None)
    jobs = opts.jobs or (1 if needs_events else default_jobs(files))
    started = _started_read(runs[0].paths, opts) if jobs == 1 and opts.dask is None else None
    from analysis.api import open_runs  # pandas and the analysis: imported while the first file reads

    options = replace(opts, jobs=jobs)
    return open_runs(
        runs,
        options,
        progress=progress,
        task=task,
        keep_traces=keep_traces,
        needs_events=needs_events,
        overlap_detail=overlap_detail,
        started=started,
    )


def _started_read(paths: Sequence[Path], opts: AnalysisOptions) -> StartedRead | None:
    """The first run's first file sniffed and, for a plain nsys export, opened with its large tables' first
    chunks reading on threads (trace/readers/read.py says why and what it buys), unless the load
    cache holds the run. Called before open_runs is imported: the reads go on while it is."""
    from analysis.cache.loads import holds
    from analysis.trace.readers.read import start_read

    if holds(paths, opts.patterns, False if opts.no_cache else None):
        return None
    return start_read(paths[0])


def patterns_from(args: argparse.Namespace) -> Patterns:
    """The Patterns the options name (TraceError naming a bad regex)."""
    return AnalysisOptions(**{name: getattr(args, name) for name in PATTERNS}).patterns


def short_trace(path: str) -> str:
    """A run's path as a table cell: the file name, or the first file's and how many more (the
    `trace` column tables add when two runs share an implementation name)."""
    files = str(path).split(", ")
    return Path(files[0]).name + (f" (+{len(files) - 1} files)" if len(files) > 1 else "")


def report_failures(results: Sequence[RunResult]) -> list[str]:
    """Print each failed run's one-line error, then, when there were several, a closing line naming
    every failed file; returns the failed files."""
    errors = [r.error for r in results if r.error is not None]
    for error in errors:
        print(f"error: {error}", file=sys.stderr, flush=True)
    bad = [str(p) for r in results for p in r.failed]
    if len(errors) > 1:  # one error line already names its file(s)
        total = sum(len(r.run.paths) for r in results)
        print(f"error: {len(bad)} of {total} files failed: {', '.join(bad)}", file=sys.stderr, flush=True)
    return bad


def fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr, flush=True)
    return 2


def run(body: Callable[[], int], no_cache: bool = False) -> int:
    """body()'s exit code; bad input (TraceError, an OSError on a path, running out of memory) is one
    line on stderr and exit code 2. No helper process of a pool outlives it (pool.stop_helpers).
    no_cache (--no-cache): no analysis cache read or written by any load of body(), its helper processes'
    and a baseline's included (cache/key.py: cache_off)."""
    try:
        with cache_off() if no_cache else nullcontext():
            return body()
    except TraceError as e:
        return fail(str(e))
    except MemoryError:
        return fail("out of memory while analysing the trace(s)")
    except OSError as e:
        return fail(f"{e.filename or ''}: {e.strerror or e}")
    finally:
        if "analysis.parallel.pool" in sys.modules:  # a pool may have run: its helpers go with the command
            from analysis.parallel.pool import stop_helpers

            stop_helpers(tracker=True)


def exit_process(command: str) -> NoReturn:
    """Run the module `command`'s main as this process (the `python -m analysis.<command>` entries) and exit
    with its code.

    The process is the command's, so it chooses Arrow's allocator before the command's imports load pyarrow:
    the system's (glibc) rather than mimalloc, pyarrow's default, which keeps the pages Arrow frees (the
    readers' batches) for Arrow's own next allocations while the analysis allocates through numpy. The
    report of the five H100 examples peaked at 224-226 MiB with it and 249 MiB without
    (benchmarks/headline.py, report_h100). A pool the user named is kept; importing the package changes
    nothing (tests/analysis/test_package.py)."""
    os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")
    sys.exit(import_module(command).main())


def emit(write: Callable[[], None]) -> None:
    """Print the results; a reader that closed the pipe (`| head`) has all it wanted."""
    try:
        write()
    except BrokenPipeError:
        sys.stderr.close()
