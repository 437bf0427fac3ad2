"""The cheaper pieces of the per-rank merge against the one-piece code they stand for: the lean
wait/transfer split (collective_rows.split_rows), a file's compute cut to its calls (file_task),
ranks renumbered across files (rank_merge) and the column reader's numpy-owned arrays (sqlite_read)."""

from __future__ import annotations

import sqlite3

import numpy as np
import pandas as pd
import pytest

from analysis.collectives.collective_rows import SPLIT_COLUMNS, rows_of_calls, split_rows
from analysis.measure import intervals as iv
from analysis.measure.collective_calls import find_calls
from analysis.parallel.file_task import _overlapping, calls_to_ship
from analysis.parallel.rank_merge import _op_codes, _renumbered
from analysis.run.loaded_run import load_trace
from analysis.trace.readers import sqlite_read
from tests.support.synthetic_ddp import write_ddp_trace


@pytest.fixture(scope="module")
def two_rank_trace(tmp_path_factory):
    path = write_ddp_trace(tmp_path_factory.mktemp("t") / "two.sqlite", n_kernels=4_000, n_ranks=2, n_steps=3)
    return load_trace(path)


def test_split_rows_are_the_full_rows_split_columns(two_rank_trace):
    calls = find_calls(two_rank_trace)
    full = rows_of_calls(calls, 2, "p", "i", 2)[0]
    lean = split_rows(calls, 2)
    columns = ["rank", "step", "paired", *SPLIT_COLUMNS]
    pd.testing.assert_frame_equal(lean[columns], full[columns], check_exact=True)
    assert full["paired"].all()
    # op only groups the calls: integer codes give the same figures as the names
    coded = calls.frame.assign(op=pd.factorize(calls.frame["op"])[0])
    recoded = split_rows(type(calls)(coded, calls.source, calls.compute), 2)
    pd.testing.assert_frame_equal(recoded, lean, check_exact=True)


def test_shipped_compute_is_the_full_compute_under_the_calls(two_rank_trace):
    calls = find_calls(two_rank_trace)
    shipped = calls_to_ship(calls)
    for rank, (s, e) in calls.compute.items():
        mine = calls.frame[calls.frame["rank"] == rank]
        spans = iv.union(mine["start_ns"], mine["end_ns"])
        expected = iv.intersect(s, e, *spans)  # the full sweep over every compute interval
        assert all(np.array_equal(a, b) for a, b in zip(shipped.compute[rank], expected, strict=True))
        assert 0 < len(shipped.compute[rank][0]) < len(s)


def test_overlapping_matches_brute_force():
    rng = np.random.default_rng(5)
    starts = rng.integers(0, 10_000, 400)
    ends = starts + rng.integers(0, 300, 400)  # empty intervals too
    span_starts = rng.integers(0, 10_000, 40)
    span_s, span_e = iv.union(span_starts, span_starts + rng.integers(1, 200, 40))
    expected = [
        any(ss < e and se > s for ss, se in zip(span_s, span_e, strict=True)) for s, e in zip(starts, ends, strict=True)
    ]
    assert _overlapping(starts, ends, span_s, span_e).tolist() == expected
    assert any(expected) and not all(expected)
    assert not _overlapping(starts, ends, iv.EMPTY, iv.EMPTY).any()


def test_renumbered_maps_local_ranks_and_rejects_unknown_ones():
    ranks = pd.DataFrame({"rank": [1, 0], "part": [3, 3], "pid": [9, 8], "device": [0, 1], "global_rank": [5, 4]})
    frame = pd.DataFrame({"rank": [0, 1, 1, 0], "pid": [8, 9, 9, 8], "device": [1, 0, 0, 1], "x": [1.0, 2, 3, 4]})
    out = _renumbered(frame, 3, ranks)
    assert out["rank"].tolist() == [4, 5, 5, 4] and out["part"].tolist() == [3] * 4
    assert frame["rank"].tolist() == [0, 1, 1, 0]  # the caller's frame is not modified
    with pytest.raises(ValueError, match="not in the file's rank table"):
        _renumbered(frame.assign(rank=[0, 1, 2, 0]), 3, ranks)


def test_op_codes_are_one_table_across_files():
    a = pd.Series(["all_reduce", "broadcast", "all_reduce"], dtype="category")
    b = pd.Series(["broadcast", "all_gather", None], dtype="category")
    c = pd.Series(["all_gather"])  # plain strings too
    codes = _op_codes([a, b, c])
    names = dict(zip(["all_reduce", "broadcast", "all_gather"], [codes[0][0], codes[0][1], codes[1][1]], strict=True))
    assert len(set(names.values())) == 3
    assert codes[1].tolist() == [names["broadcast"], names["all_gather"], -1]
    assert codes[2].tolist() == [names["all_gather"]]


def test_column_reads_give_numpy_owned_arrays_equal_to_sqlite3(tmp_path):
    path = tmp_path / "c.sqlite"
    n = 200_000  # several Arrow chunks
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE t (a INTEGER, b INTEGER, f REAL)")
    rows = [(i, None if i % 7 == 0 else -i, i / 3) for i in range(n)]
    conn.executemany("INSERT INTO t VALUES (?, ?, ?)", rows)
    conn.commit()
    sql, names = "SELECT a, b, f FROM t", ["a", "b", "f"]
    fast = sqlite_read.read_connectorx(path, sql, names, -1, {})
    slow = sqlite_read._read_sqlite3(conn, sql, names, -1)
    conn.close()
    for name in ("a", "b"):
        assert fast[name].dtype == np.int64 and fast[name].flags.owndata
        assert np.array_equal(fast[name], slow[name])
    assert fast["b"][0] == -1 and fast["b"][1] == -1  # NULL -> null_int
    assert fast["f"].dtype == np.float64 and fast["f"].flags.owndata
    assert np.allclose(fast["f"], [r[2] for r in rows])
