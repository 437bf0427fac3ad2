"""What every analysis CLI shares: the input options (the same names and metavars everywhere), opening
the runs they name (engine/session.py), the one error-to-exit-code path, output to a closed pipe.

Exit status: 0 ok, 2 bad input (one line on stderr, never a traceback).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from analysis.errors import TraceError
from analysis.frames.patterns import Patterns

if TYPE_CHECKING:
    from analysis.engine.loaded import RunResult
    from analysis.engine.session import OpenRuns

EXIT_STATUS = "Exit status: 0 ok, 2 bad input (one line on stderr: error: ...)."
TRACE_HELP = (
    "nsys SQLite exports (`nsys export --type sqlite`) or torch.profiler JSON traces (.json/.json.gz); "
    "<run>.rank<N>.* files of one folder (run_nsys.sh --per-rank, --profiler torch) are one run, "
    "any files are one run with --merge"
)


def add_input_options(parser: argparse.ArgumentParser, what: str = "one result each") -> None:
    """TRACE..., --merge, --export, --skip-steps, --step, --rank, --jobs, --dask and the pattern
    options: what every analysis CLI reads its runs with."""
    parser.add_argument("paths", nargs="+", metavar="TRACE", help=f"{TRACE_HELP}; runs give {what}")
    parser.add_argument(
        "--merge",
        action="store_true",
        help="treat all TRACEs as one run (one rank per file, clocks aligned); files of different runs, "
        "or the same rank twice, are refused",
    )
    parser.add_argument(
        "--export", action="store_true", help="given a .nsys-rep, run `nsys export` first when nsys is found"
    )
    parser.add_argument(
        "--skip-steps", type=int, default=0, metavar="N", help="leave each rank's first N steps out (warm-up)"
    )
    parser.add_argument("--step", type=int, metavar="N", help="only step N")
    parser.add_argument("--rank", type=int, metavar="R", help="only rank R")
    parser.add_argument(
        "--jobs",
        type=int,
        default=None,
        metavar="N",
        help="analyse files in N processes (overlap's default: the usable cores, at most one per file, "
        "fewer when memory cannot hold that many files at once, 1 for inputs under 64 MB in all; "
        "collectives, timeline and report, which need every run's events, default to 1: each run read "
        "once, here)",
    )
    parser.add_argument(
        "--dask",
        metavar="ADDRESS",
        help="run the per-file tasks on the Dask cluster at ADDRESS (tcp://host:8786; 'local': a "
        "LocalCluster of --jobs workers); paths must be visible to the workers. Needs dask[distributed]",
    )
    add_pattern_options(parser)


def open_from_args(
    args: argparse.Namespace,
    prefix: str,
    keep_traces: bool = True,
    task: Callable | None = None,
    needs_events: bool = False,
) -> OpenRuns:
    """The runs the input options name (session.OpenRuns), with progress lines on stderr for inputs
    of more than 200 MB (or any input analysed file by file). needs_events: the command draws or
    pairs the runs' events (collectives, timeline, report), so without --jobs/--dask each run is read
    once in this process rather than analysed file by file and read again for its events."""
    from analysis.engine.parallel import Progress, check_jobs, default_jobs
    from analysis.engine.runs import find_runs
    from analysis.engine.session import OpenRuns

    check_jobs(args.jobs)
    for name in ("step", "rank", "skip_steps"):
        value = getattr(args, name)
        if value is not None and value < 0:
            raise TraceError(f"--{name.replace('_', '-')} {value}: must be >= 0")
    runs = find_runs(args.paths, args.merge, args.export)
    files = [p for r in runs for p in r.paths]
    big = sum(p.stat().st_size for p in files if p.is_file()) > 200 * 2**20
    progress = Progress(len(files), prefix, after_s=0 if big else None)
    jobs = args.jobs or (1 if needs_events else default_jobs(files))
    return OpenRuns(runs, patterns_from(args), args.skip_steps, jobs, args.dask, progress, keep_traces, task)


def add_pattern_options(parser: argparse.ArgumentParser) -> None:
    """--comm-pattern, --comm-range-pattern, --backward-pattern, --step-pattern (the same on every CLI)."""
    parser.add_argument(
        "--comm-pattern",
        default=Patterns.comm_kernel,
        metavar="RE",
        help="regex for communication kernel names (default: NCCL/RCCL kernels of every era)",
    )
    parser.add_argument(
        "--comm-range-pattern",
        default=Patterns.comm_range,
        metavar="RE",
        help="regex for NVTX communication ranges (work launched inside counts as communication)",
    )
    parser.add_argument(
        "--backward-pattern", default=Patterns.backward, metavar="RE", help="regex for backward NVTX ranges"
    )
    parser.add_argument(
        "--step-pattern",
        default=Patterns.step,
        metavar="RE",
        help="regex for step NVTX ranges; group 1, if any, is the step number",
    )


def patterns_from(args: argparse.Namespace) -> Patterns:
    """The Patterns the options name (TraceError naming a bad regex)."""
    return Patterns(
        comm_kernel=args.comm_pattern,
        comm_range=args.comm_range_pattern,
        backward=args.backward_pattern,
        step=args.step_pattern,
    )


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


def run(body: Callable[[], int]) -> int:
    """body()'s exit code; bad input (TraceError, an OSError on a path, running out of memory) is one
    line on stderr and exit code 2. No helper process of a pool outlives it (parallel.stop_helpers)."""
    try:
        return body()
    except TraceError as e:
        return fail(str(e))
    except MemoryError:
        return fail("out of memory while analysing the trace(s)")
    except OSError as e:
        return fail(f"{e.filename or ''}: {e.strerror or e}")
    finally:
        if "analysis.engine.parallel" in sys.modules:  # a pool may have run: its helpers go with the command
            from analysis.engine.parallel import stop_helpers

            stop_helpers(tracker=True)


def emit(write: Callable[[], None]) -> None:
    """Print the results; a reader that closed the pipe (`| head`) has all it wanted."""
    try:
        write()
    except BrokenPipeError:
        sys.stderr.close()
