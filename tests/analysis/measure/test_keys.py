"""Process and thread keys (phases.process_key, thread_key), built in place, against the plain formula
in Python ints, for arrays of any integer width, negative ids (-1: none), scalars and a mix of both."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from analysis.measure.phases import process_key, thread_key


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint16, float])
def test_keys_equal_the_formula(dtype):
    rng = np.random.default_rng(0)
    part = rng.integers(0, 4, 50)
    pid = rng.integers(0, 40_000, 50)
    tid = rng.integers(0, 5_000, 50)
    if dtype is not np.uint16:
        tid[::7] = -1  # no thread
    got_p = process_key(pd.Series(part.astype(dtype)), pid.astype(dtype))
    got_t = thread_key(part.astype(dtype), pd.Series(pid.astype(dtype)), tid.astype(dtype))
    want_p = [(int(a) << 24) | int(b) for a, b in zip(part, pid, strict=True)]
    want_t = [(((int(a) << 24) | int(b)) << 24) | int(c) for a, b, c in zip(part, pid, tid, strict=True)]
    assert (-1 in want_t) == (dtype is not np.uint16)  # or-ed with -1 (no thread), every bit is set: -1
    assert got_p.dtype == got_t.dtype == np.int64
    assert got_p.tolist() == want_p and got_t.tolist() == want_t


def test_scalars_give_a_scalar_and_mix_with_arrays():
    assert process_key(2, 7) == (2 << 24) | 7 and np.ndim(process_key(2, 7)) == 0
    assert process_key(2, np.array([7, 8], np.int32)).tolist() == [(2 << 24) | 7, (2 << 24) | 8]
    assert process_key(np.array([1, 2]), 7).tolist() == [(1 << 24) | 7, (2 << 24) | 7]
    assert thread_key(1, 5, np.array([2, 3])).tolist() == [(((1 << 24) | 5) << 24) | t for t in (2, 3)]


def test_inputs_are_left_as_they_were():
    part, pid = np.array([1, 2], np.int64), np.array([3, 4], np.int64)
    process_key(part, pid)
    assert part.tolist() == [1, 2] and pid.tolist() == [3, 4]
