"""Parameters split between the quick loop (`pytest -m "not slow"`) and the whole suite."""

from __future__ import annotations

from collections.abc import Iterable

import pytest


def slow_except(quick: Iterable, params: Iterable) -> list:
    """`params` for pytest.mark.parametrize, each marked slow except those in `quick`: the quick loop
    keeps a representative few (say, one real trace of each kind), the whole suite runs them all."""
    keep = list(quick)
    out = []
    for p in params:
        out.append(p if p in keep else pytest.param(*(p if isinstance(p, tuple) else (p,)), marks=pytest.mark.slow))
    return out
