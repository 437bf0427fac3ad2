"""Parameters split between the quick loop (a bare `pytest`) and the whole suite."""

from __future__ import annotations

from collections.abc import Iterable

import pytest


def costly_except(mark: pytest.MarkDecorator, quick: Iterable, params: Iterable) -> list:
    """`params` for pytest.mark.parametrize, each marked with the cost `mark` except those in `quick`: the
    quick loop keeps a representative few (say, one real trace of each kind), the whole suite runs them all."""
    keep = list(quick)
    out = []
    for p in params:
        out.append(p if p in keep else pytest.param(*(p if isinstance(p, tuple) else (p,)), marks=mark))
    return out
