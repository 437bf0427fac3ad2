"""NVTX ranges named by the contract in README.md ("NVTX ranges"), free when nothing records them.

`range(name)` is a push/pop range (same thread), `start(name)`/`end(id)` a start/end range that may
end on another thread (async collectives), `mark(text)` an instant. Without the `nvtx` package
(e.g. Python 3.13, where nvtx 0.2.10 has no wheel) every call is a no-op.
"""
from __future__ import annotations

import contextlib
from typing import ContextManager

try:  # nvtx==0.2.10 on purpose: newer versions are silent under nsys 2022.4 (see README "Profiling")
    import nvtx as _nvtx
except ImportError:  # pragma: no cover - exercised only where nvtx is missing
    _nvtx = None

AVAILABLE: bool = _nvtx is not None

# One cached annotate object per name: building it registers the string (about 1 us); entering a
# cached one is a C push (about 0.2 us in total), which is what keeps ranges off the step time.
_CACHE: dict[str, ContextManager] = {}
_NULL = contextlib.nullcontext()


def range(name: str, cache: bool = True) -> ContextManager:  # noqa: A001 - mirrors nvtx's push/pop range
    """Push/pop range `name` around a with-block on the calling thread.

    `cache=False` for names used once (e.g. `step 17`), so the cache does not grow with the run.
    """
    if _nvtx is None:
        return _NULL
    if not cache:
        return _nvtx.annotate(message=name)
    cm = _CACHE.get(name)
    if cm is None:
        cm = _CACHE[name] = _nvtx.annotate(message=name)
    return cm


def disable() -> None:
    """Make every call a no-op from now on in this process (a baseline without NVTX)."""
    global _nvtx, AVAILABLE
    _nvtx, AVAILABLE = None, False
    _CACHE.clear()


def start(name: str) -> object:
    """Open a start/end range; pass the returned id to `end`, from any thread."""
    return _nvtx.start_range(message=name) if _nvtx is not None else None


def end(range_id: object) -> None:
    """Close a range opened by `start` (a None id, from the no-op fallback, is ignored)."""
    if _nvtx is not None and range_id is not None:
        _nvtx.end_range(range_id)


def mark(text: str) -> None:
    """An instantaneous NVTX event carrying `text`."""
    if _nvtx is not None:
        _nvtx.mark(message=text)
