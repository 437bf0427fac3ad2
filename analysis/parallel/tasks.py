"""One task's outcome, the same from the serial loop, the process pool and Dask: `call_task(fn, item) -> Outcome`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from analysis.errors import TraceError


@dataclass(frozen=True)
class Outcome:
    """What one task gave: `value`, or `error` (one line naming the file) when it failed."""

    item: Any
    value: Any = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def failure_line(item: Any, error: BaseException) -> str:
    """One line for a task's exception: a TraceError's message names its file already."""
    if isinstance(error, TraceError):
        return str(error)
    if isinstance(error, MemoryError):
        return f"{item}: out of memory while analysing it"
    first = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return f"{item}: {type(error).__name__}: {first}"


def call_task(fn: Callable, item: Any) -> Outcome:
    try:
        return Outcome(item, fn(item))
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as e:  # any failure of one file is that file's one-line error
        return Outcome(item, error=failure_line(item, e))
