"""trace/build_frames.py against brute force: the batched launch join, the one-key sort,
factorize, each rank's rows, and narrow identifiers only where they fit."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from analysis.trace.build_frames import (
    LaunchJoin,
    factorize,
    group_index,
    ops_frame,
    rank_rows,
    smallest_int,
    sort_order,
)
from analysis.trace.readers.sqlite_read import narrowed


def brute_launches(pid, corr, rt_pid, rt_corr, rt_start, rt_tid):
    """Per op, the last runtime row with its (pid, corr), by a loop; -1 when none or corr < 0."""
    last = {}
    for p, c, s, t in zip(rt_pid.tolist(), rt_corr.tolist(), rt_start.tolist(), rt_tid.tolist(), strict=True):
        last[(p, c)] = (s, t)
    got = [last.get((p, c), (-1, -1)) if c >= 0 else (-1, -1) for p, c in zip(pid.tolist(), corr.tolist(), strict=True)]
    return [g[0] for g in got], [g[1] for g in got]


@pytest.mark.parametrize("corr_scale", [1, 1_000_003])  # dense counters, and ids too sparse for a table
@pytest.mark.parametrize("batch", [1, 7, 10_000])
def test_launch_join_matches_a_loop(corr_scale, batch):
    rng = np.random.default_rng(corr_scale + batch)
    n_ops, n_rt = 400, 500
    pid = rng.choice([11, 12, 13], n_ops).astype(np.int32)
    corr = rng.integers(-1, 300, n_ops) * corr_scale  # -1 (NULL) among them, and repeated ids (graph launches)
    corr[corr < 0] = -1
    rt_pid = rng.choice([11, 12, 14], n_rt)  # a process without kernels, and one kernel process without calls
    rt_corr = rng.integers(0, 320, n_rt) * corr_scale  # duplicates too: the last one read wins
    rt_start, rt_tid = rng.integers(0, 10**12, n_rt), rng.integers(0, 1 << 24, n_rt).astype(np.int32)
    join = LaunchJoin(pid, corr)
    for lo in range(0, n_rt, batch):
        hi = lo + batch
        join.add(rt_pid[lo:hi], rt_corr[lo:hi], rt_start[lo:hi], rt_tid[lo:hi])
    start, tid = join.result()
    want_start, want_tid = brute_launches(pid, corr, rt_pid, rt_corr, rt_start, rt_tid)
    assert start.tolist() == want_start and tid.tolist() == want_tid
    assert start.dtype == np.int64 and tid.dtype == np.int32
    assert (start >= 0).any() and (start == -1).any()  # the case is not vacuous


def test_launch_join_without_runtime_calls_or_ids():
    start, tid = LaunchJoin(np.array([5, 5]), np.array([-1, -1])).result()
    assert start.tolist() == [-1, -1] and tid.tolist() == [-1, -1]
    start, tid = LaunchJoin(np.zeros(0, np.int32), np.zeros(0, np.int64)).result()
    assert len(start) == 0 and len(tid) == 0


@pytest.mark.parametrize("span", [50, 1 << 61])  # one int64 key, and the lexsort fallback
@pytest.mark.parametrize("first", [0, 1 << 60, -(1 << 60)])  # times from 0, far on, and before 0
def test_sort_order_is_lexsort(span, first):
    rng = np.random.default_rng(span % 97)
    n = 2_000
    part, pid = rng.integers(0, 3, n), rng.choice([70_000, 5, 900], n)
    device, start = rng.integers(-1, 4, n), first + rng.integers(0, span, n)  # many ties: stability matters
    want = np.lexsort((start, device, pid, part))
    assert sort_order(part, pid, device, start).tolist() == want.tolist()
    stream = rng.integers(0, 2**40, n)  # a sparse key among them (factorize falls back to np.unique)
    want = np.lexsort((start, stream, pid, part))
    assert sort_order(part, pid, stream, start).tolist() == want.tolist()


@pytest.mark.parametrize(
    "keys",
    [
        np.array([3, -5, 3, 4, -5], dtype=np.int32),
        np.array([7, 7, 7], dtype=np.int32),  # one value
        np.array([200, 3, 255], dtype=np.uint8),
        np.array([-(2**31), -(2**31) + 9, -(2**31)], dtype=np.int32),  # offsets near the type's end
        np.array([5, 2**40, -3]),  # too sparse for the table: np.unique
        np.zeros(0, dtype=np.int32),
    ],
)
@pytest.mark.parametrize("compact", [False, True])
def test_factorize_is_unique_with_inverse(keys, compact):
    uniq, inverse = factorize(keys, compact=compact)
    want_uniq, want_inverse = np.unique(keys.astype(np.int64), return_inverse=True)
    assert uniq.dtype == np.int64 and uniq.tolist() == want_uniq.tolist()
    assert inverse.tolist() == want_inverse.reshape(-1).tolist()
    if compact and keys.size and np.ptp(keys) < 2**20:  # the table's case: an index as narrow as it can be
        assert np.iinfo(inverse.dtype).max >= uniq.size - 1 and inverse.dtype.itemsize <= 2


def test_factorize_compact_over_many_keys():
    keys = np.arange(40_000, dtype=np.int32)[::-1] * 3  # more keys than int16 numbers: a wider index
    uniq, inverse = factorize(keys, compact=True)
    assert inverse.dtype == np.int32 and (uniq[inverse] == keys).all()


@pytest.mark.parametrize(
    "values, dtype",
    [
        ([-1, -1], np.int8),
        ([-128, 127], np.int16),  # each fits int8, but not the span between them (255)
        ([-1, 127], np.int16),
        ([0, 127], np.int8),
        ([7, 13, 20], np.int8),
        ([0, 40_000], np.int32),
        ([-1, 2**31 - 1], np.int64),  # the span does not fit int32
        ([0, 2**40], np.int64),
        ([], np.int8),
    ],
)
def test_smallest_int_holds_the_values_and_their_span(values, dtype):
    a = np.array(values, dtype=np.int64)
    got = smallest_int(a)
    assert got.dtype == dtype and got.tolist() == values
    if a.size:
        assert int(got.max()) - int(got.min()) <= np.iinfo(got.dtype).max  # an offset from the least cannot wrap
    assert smallest_int(got) is got  # already its own type: no copy


@pytest.mark.parametrize("shuffled", [False, True])  # sorted as ops_frame leaves it, and not
def test_rank_rows_are_groupby_indices(shuffled):
    rng = np.random.default_rng(3)
    n = 500
    ops = pd.DataFrame(
        {"part": rng.integers(0, 2, n), "pid": rng.choice([9, 4], n), "device": rng.integers(0, 3, n)}
    ).astype(np.int32)
    if not shuffled:
        ops = ops.sort_values(["part", "pid", "device"], kind="stable").reset_index(drop=True)
    want = {tuple(map(int, k)): v.tolist() for k, v in ops.groupby(["part", "pid", "device"]).indices.items()}
    rows = rank_rows(ops)
    assert {k: np.arange(n)[v].tolist() for k, v in rows.items()} == want
    assert all(isinstance(v, slice) for v in rows.values()) == (not shuffled)  # one run each: a slice
    assert rank_rows(ops.iloc[:0]) == {}


@pytest.mark.parametrize("sparse", [False, True])
def test_group_index_numbers_the_combinations_as_groupby(sparse):
    rng = np.random.default_rng(5)
    n = 3_000
    keys = {
        "part": np.zeros(n, dtype=np.int32),  # one value: orders nothing
        "pid": rng.choice([40_000, 7, 123], n).astype(np.int32),
        "device": rng.integers(0, 4, n),
        "stream": rng.integers(0, 2**40 if sparse else 30, n),  # ids too sparse for the table, and not
    }
    got = group_index(*keys.values())
    want = pd.DataFrame(keys).groupby(list(keys), sort=False).ngroup().to_numpy()
    assert got.min() >= 0 and got.max() < max(n + 1024, 3 * 4 * 30)
    pairs = set(zip(got.tolist(), want.tolist(), strict=True))
    assert len(pairs) == len(set(want.tolist()))  # one id per combination, the same rows together


def test_narrowed_only_where_every_value_fits():
    small, big = np.array([-1, 5, 2**31 - 1]), np.array([0, 2**31])
    assert narrowed(small, np.int32).dtype == np.int32 and narrowed(small, np.int32).tolist() == small.tolist()
    assert narrowed(big, np.int32).dtype == np.int64 and narrowed(big, np.int32).tolist() == big.tolist()
    assert narrowed(small, None) is small


def test_ops_frame_narrows_identifiers_that_fit_and_keeps_values():
    import pandas as pd

    def part(p, stream):
        n = len(stream)
        return {
            "part": np.full(n, p),
            "pid": np.full(n, 7),
            "device": np.zeros(n, np.int64),
            "stream": np.array(stream),
            "start": np.arange(n)[::-1] * 10,
            "end": np.arange(n)[::-1] * 10 + 5,
            "correlation_id": np.arange(n),
            "launch_start": np.full(n, -1),
            "launch_tid": np.full(n, -1),
            "name": pd.Categorical(["k"] * n),
            "kind": np.zeros(n, np.int8),
        }

    frame = ops_frame([part(0, [1, 2, 3]), part(1, [2**40, 4])])  # a stream id past int32 stays int64
    assert frame["pid"].dtype == np.int32 and frame["stream"].dtype == np.int64
    assert frame["part"].dtype == np.int8 and frame["device"].dtype == np.int8  # the smallest that holds them
    assert frame["comm_bytes"].dtype == np.int8  # none recorded: all -1
    assert frame["start"].tolist() == [0, 10, 20, 0, 10]  # sorted by (part, pid, device, start)
    assert frame["stream"].tolist() == [3, 2, 1, 4, 2**40]
    assert frame["comm_bytes"].tolist() == [-1] * 5
    sized = part(0, [1, 2, 3]) | {"comm_bytes": np.array([-1, 2**33, 4096])}  # Kineto's NCCL kernel sizes
    frame = ops_frame([sized])
    assert frame["comm_bytes"].dtype == np.int64 and frame["comm_bytes"].tolist() == [4096, 2**33, -1]
    assert frame["stream"].dtype == np.int8 and frame["stream"].tolist() == [3, 2, 1]
