"""NVTX ranges named by the contract in README.md ("NVTX ranges"), free when nothing records them.

`range(name)` is a push/pop range (same thread), `start(name)`/`end(id)` a start/end range that may
end on another thread (async collectives), `mark(text)` an instant. `payload=` (an int) rides in the
range: the `comm:*` ranges carry their collective's byte count there, which nsys 2022.4 stores in
NVTX_EVENTS.int64Value. Without the `nvtx` package (e.g. Python 3.13, where nvtx 0.2.10 has no
wheel) every call is a no-op. `record_with(recorder)` sends every call to another recorder instead
(profiling's torch.profiler one).
"""

from __future__ import annotations

import contextlib
from typing import Any

try:  # nvtx==0.2.10 on purpose: newer versions are silent under nsys 2022.4 (see README "Profiling")
    import nvtx as _nvtx
except ImportError:  # pragma: no cover - exercised only where nvtx is missing
    _nvtx = None

AVAILABLE: bool = _nvtx is not None

# One cached annotate object per (name, payload): building it registers the string (about 1 us);
# entering a cached one is a C push (about 0.2 us in total), which keeps ranges off the step time.
_CACHE: dict[tuple[str, int | None], contextlib.AbstractContextManager] = {}
_NULL = contextlib.nullcontext()
_recorder: Any = None  # when set, ranges and marks go to it instead of NVTX


def record_with(recorder: Any) -> None:
    """Send every range, start/end and mark to `recorder` (an object with range(name, payload),
    start(name, payload), end(id) and mark(text) methods) instead of NVTX; None sends them back to NVTX."""
    global _recorder
    _recorder = recorder


def range(name: str, cache: bool = True, payload: int | None = None) -> contextlib.AbstractContextManager:
    """Push/pop range `name` (integer `payload` attached, if given) around a with-block on this thread.

    `cache=False` for names used once (e.g. `step 17`), so the cache does not grow with the run.
    """
    if _recorder is not None:
        return _recorder.range(name, payload)
    if _nvtx is None:
        return _NULL
    if not cache:
        return _nvtx.annotate(message=name, payload=payload)
    key = (name, payload)
    cm = _CACHE.get(key)
    if cm is None:
        cm = _CACHE[key] = _nvtx.annotate(message=name, payload=payload)
    return cm


def disable() -> None:
    """Make every call a no-op from now on in this process (a baseline without NVTX)."""
    global _nvtx, AVAILABLE
    _nvtx, AVAILABLE = None, False
    _CACHE.clear()


def start(name: str, payload: int | None = None) -> object:
    """Open a start/end range (integer `payload` attached, if given); pass the id to `end`, from any thread."""
    if _recorder is not None:
        return _recorder.start(name, payload)
    return _nvtx.start_range(message=name, payload=payload) if _nvtx is not None else None


def end(range_id: object) -> None:
    """Close a range opened by `start` (a None id, from the no-op fallback, is ignored)."""
    if _recorder is not None:
        _recorder.end(range_id)
    elif _nvtx is not None and range_id is not None:
        _nvtx.end_range(range_id)


def mark(text: str) -> None:
    """An instantaneous NVTX event carrying `text`."""
    if _recorder is not None:
        _recorder.mark(text)
    elif _nvtx is not None:
        _nvtx.mark(message=text)
