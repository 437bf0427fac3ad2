"""Interval algebra against a brute-force reference over integer points (hypothesis)."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from analysis.measure import intervals as iv
from analysis.trace.build_frames import factorize

HORIZON = 60

interval = st.tuples(st.integers(0, HORIZON), st.integers(0, 12)).map(lambda t: (t[0], t[0] + t[1]))
interval_lists = st.lists(interval, max_size=12)


def arrays(items):
    return (np.array([s for s, _ in items], dtype=np.int64), np.array([e for _, e in items], dtype=np.int64))


def points(items) -> set[int]:
    """Brute force: the integer points t with start <= t < end for some interval."""
    return {t for s, e in items for t in range(s, e)}


def pieces_points(s, e) -> set[int]:
    return points(zip(s.tolist(), e.tolist(), strict=True))


def length(s, e) -> int:
    """The measure of a canonical set: its pieces' lengths summed."""
    return int(np.sum(e - s))


def is_canonical(s, e) -> bool:
    return bool(np.all(e > s) and np.all(s[1:] > e[:-1]))


@given(interval_lists)
def test_union_covers_the_same_points_in_canonical_form(items):
    s, e = iv.union(*arrays(items))
    assert pieces_points(s, e) == points(items)
    assert is_canonical(s, e)
    assert length(s, e) == len(points(items))


@given(interval_lists, st.floats(0, 8))
def test_union_with_a_gap_joins_exactly_the_pieces_closer_than_it(items, gap):
    exact_s, exact_e = iv.union(*arrays(items))
    s, e = iv.union(*arrays(items), gap=gap)
    assert points(items) <= pieces_points(s, e)  # covers everything, plus only the joined gaps
    assert np.all(s[1:] - e[:-1] >= max(gap, 1))  # what stays apart is at least `gap` apart
    joined = pieces_points(s, e) - points(items)
    holes = pieces_points(exact_e[:-1], exact_s[1:])  # the gaps between the exact pieces
    small = {
        t for a, b in zip(exact_e[:-1].tolist(), exact_s[1:].tolist(), strict=True) if b - a < gap for t in range(a, b)
    }
    assert joined == small and joined <= holes


@given(interval_lists, st.floats(0, 8))
def test_union_of_a_canonical_set_is_that_set_itself_unless_a_gap_joins_pieces(items, gap):
    s, e = iv.union(*arrays(items))  # canonical: the fast path's input
    again_s, again_e = iv.union(s, e)
    assert again_s is s and again_e is e  # no copy
    joined_s, joined_e = iv.union(s, e, gap=gap)
    apart = bool(np.all(s[1:] - e[:-1] >= max(gap, 1)))
    assert (joined_s is s) == apart
    assert pieces_points(joined_s, joined_e) == pieces_points(*iv.union(*arrays(items), gap=gap))


@given(interval_lists)
def test_union_leaves_its_inputs_as_they_were(items):
    s, e = arrays(items)
    before = (s.copy(), e.copy())
    iv.union(s, e)
    assert np.array_equal(s, before[0]) and np.array_equal(e, before[1])


@given(interval_lists, interval_lists)
def test_intersect_and_subtract_match_set_algebra(a, b):
    inter = iv.intersect(*arrays(a), *arrays(b))
    diff = iv.subtract(*arrays(a), *arrays(b))
    assert pieces_points(*inter) == points(a) & points(b)
    assert pieces_points(*diff) == points(a) - points(b)
    assert is_canonical(*inter) and is_canonical(*diff)


@given(interval_lists, st.integers(-5, HORIZON + 15), st.integers(-5, HORIZON + 15))
def test_clip_keeps_only_the_window(items, lo, hi):
    s, e = iv.clip(*arrays(items), lo, hi)
    assert pieces_points(s, e) == {t for t in points(items) if lo <= t < hi}
    assert np.all(e > s)


@given(interval_lists, st.lists(st.integers(-5, HORIZON + 15), max_size=10))
def test_covered_before_and_contains(items, ts):
    s, e = iv.union(*arrays(items))
    covered = points(items)
    t = np.array(ts, dtype=np.int64)
    assert iv.covered_before(s, e, t).tolist() == [len({p for p in covered if p < x}) for x in ts]
    assert iv.contains(s, e, t).tolist() == [x in covered for x in ts]


@given(interval_lists, interval_lists)
def test_overlap_lengths_per_interval(queries, other):
    s, e = iv.union(*arrays(other))
    got = iv.overlap_lengths(*arrays(queries), s, e)
    assert got.tolist() == [len(set(range(a, b)) & points(other)) for a, b in queries]


@given(interval_lists)
def test_shared_lengths_split_each_instant_among_the_intervals_over_it(items):
    got = iv.shared_lengths(*arrays(items))
    over = lambda t: sum(a <= t < b for a, b in items)
    want = [sum(1 / over(t) for t in range(a, b)) for a, b in items]
    assert got == pytest.approx(want, abs=1e-9)
    assert got.sum() == pytest.approx(len(points(items)))  # the shares add up to the time covered


@settings(max_examples=150)
@given(st.lists(st.tuples(st.integers(-3, 3), interval), max_size=20))
def test_keyed_union_is_one_union_per_key(rows):
    keys = np.array([k for k, _ in rows], dtype=np.int64)
    s, e = arrays([i for _, i in rows])
    out_k, out_s, out_e = iv.keyed_union(keys, s, e)
    for key in set(keys.tolist()):
        mine = out_k == key
        assert pieces_points(out_s[mine], out_e[mine]) == points([i for k, i in rows if k == key])
        assert is_canonical(out_s[mine], out_e[mine])
    assert set(out_k.tolist()) <= set(keys.tolist())
    assert np.all(np.diff(out_k) >= 0)


@given(st.lists(st.tuples(st.integers(0, 3), interval), max_size=16))
def test_keyed_union_of_its_own_pieces_gives_them_back_as_they_are(rows):
    keys = np.array([k for k, _ in rows], dtype=np.int64)
    s, e = arrays([i for _, i in rows])
    pieces = iv.keyed_union(keys, s, e)  # keys in order, each key's pieces canonical: the fast path's input
    again = iv.keyed_union(*pieces)
    assert [a.tolist() for a in again] == [a.tolist() for a in pieces]
    if is_canonical(pieces[1], pieces[2]):  # apart across keys too (one stream's kernels by step): not copied
        assert again[1] is pieces[1] and again[2] is pieces[2]
    # and as the slow path makes them, when one key's stretch is moved past the others' (keys out of order)
    if pieces[0].size > 1 and pieces[0][0] != pieces[0][-1]:
        order = np.argsort(-pieces[0], kind="stable")
        shuffled = iv.keyed_union(*(p[order] for p in pieces))
        assert [a.tolist() for a in shuffled] == [a.tolist() for a in pieces]


@given(interval_lists, interval_lists)
def test_meeting_keeps_exactly_the_pieces_that_overlap_the_other_set(a, b):
    s, e = iv.union(*arrays(a))
    other = iv.union(*arrays(b))
    got = iv._meeting(s, e, *other)
    want = [(x, y) for x, y in zip(s.tolist(), e.tolist(), strict=True) if set(range(x, y)) & pieces_points(*other)]
    assert list(zip(got[0].tolist(), got[1].tolist(), strict=True)) == want


def test_large_times_stay_exact():
    """Nanosecond timestamps near 2^62 must not lose precision (no float conversions)."""
    base = 2**62
    s = np.array([base, base + 5, base + 100], dtype=np.int64)
    e = np.array([base + 10, base + 20, base + 101], dtype=np.int64)
    assert length(*iv.union(s, e)) == 21
    assert length(*iv.intersect(s, e, np.array([base + 15]), np.array([base + 1000]))) == 6


def test_touching_intervals_merge_and_empty_ones_vanish():
    s, e = iv.union([0, 5, 9], [5, 9, 9])
    assert s.tolist() == [0] and e.tolist() == [9]
    assert iv.union([], [])[0].size == 0


@given(st.lists(st.integers(-(2**40), 2**40), max_size=30) | st.lists(st.integers(-3, 50), max_size=30))
def test_factorize_equals_numpy_unique(keys):
    uniq, inverse = factorize(np.array(keys, dtype=np.int64))
    expected_uniq, expected_inverse = np.unique(np.array(keys, dtype=np.int64), return_inverse=True)
    assert uniq.tolist() == expected_uniq.tolist() and inverse.tolist() == expected_inverse.reshape(-1).tolist()
