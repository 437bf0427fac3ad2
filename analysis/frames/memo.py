"""Measures of a loaded trace computed once per trace object and shared by every caller.

A report draws each run several times (its timeline page, its panel of the side-by-side page, its
Collectives charts) from the one loaded `Trace`; each drawing asks for the same per-trace measures
(every rank's activity, every step's backward span). `once_per_trace` keeps a function's result for
as long as the trace object lives, keyed by the trace's identity and the patterns, so those measures
are computed once. Results are shared: callers must not modify them (no function here modifies its
inputs, the project's rule). A trace is never changed after loading (frozen), so a result cannot go
stale; a new trace object (a filtered copy, a re-read file) gets its own results.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

from analysis.frames.patterns import Patterns
from analysis.frames.trace import Trace

R = TypeVar("R")
_RESULTS: dict[int, dict[tuple[str, Patterns], Any]] = {}  # id(trace) -> (function, patterns) -> result


def _results_of(trace: Trace) -> dict[tuple[str, Patterns], Any]:
    key = id(trace)
    results = _RESULTS.get(key)
    if results is None:
        results = _RESULTS[key] = {}
        weakref.finalize(trace, _RESULTS.pop, key, None)  # gone with the trace: an id is reused only after that
    return results


def once_per_trace(fn: Callable[[Trace, Patterns], R]) -> Callable[[Trace, Patterns | None], R]:
    """`fn(trace, patterns)` computed once per (trace object, patterns); `patterns` None is the defaults."""

    name = f"{fn.__module__}.{fn.__qualname__}"

    @functools.wraps(fn)
    def shared(trace: Trace, patterns: Patterns | None = None) -> R:
        patterns = patterns or Patterns()
        results = _results_of(trace)
        key = (name, patterns)
        if key not in results:
            results[key] = fn(trace, patterns)
        return results[key]

    return shared


def cached_count() -> int:
    """How many traces currently have results kept (tests check results go with their trace)."""
    return len(_RESULTS)
