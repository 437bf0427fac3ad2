"""What every CLI shares: the pattern options, the one error-to-exit-code path, output to a closed pipe.

Exit codes: 0 ok, 2 bad input (one line on stderr, never a traceback).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from analysis.errors import TraceError
from analysis.frames.patterns import Patterns


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


def fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr, flush=True)
    return 2


def run(body: Callable[[], int]) -> int:
    """body()'s exit code; bad input (TraceError, an OSError on a path, running out of memory) is one
    line on stderr and exit code 2."""
    try:
        return body()
    except TraceError as e:
        return fail(str(e))
    except MemoryError:
        return fail("out of memory while analysing the trace(s)")
    except OSError as e:
        return fail(f"{e.filename or ''}: {e.strerror or e}")


def emit(write: Callable[[], None]) -> None:
    """Print the results; a reader that closed the pipe (`| head`) has all it wanted."""
    try:
        write()
    except BrokenPipeError:
        sys.stderr.close()
