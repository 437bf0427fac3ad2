"""Interval algebra on half-open [start, end) int64 nanosecond intervals, vectorised with numpy.

A *set* is a pair of int64 arrays (starts, ends). `union` turns any set into its canonical form:
disjoint, sorted, no empty pieces, touching pieces merged. `intersect` and `subtract` accept any
sets and return canonical ones. `keyed_union` does many unions at once (one per key, e.g. per step).
Lengths are exact integers: the measure of a union, never a sum of overlapping durations.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from analysis.trace.build_frames import factorize

Set = tuple[np.ndarray, np.ndarray]
EMPTY = np.zeros(0, dtype=np.int64)


def _as_int64(a: ArrayLike) -> np.ndarray:
    return np.asarray(a, dtype=np.int64)


def union(starts: ArrayLike, ends: ArrayLike, gap: float = 0) -> Set:
    """Canonical form of a set: the disjoint, sorted pieces covering the same points.

    With gap > 0, pieces separated by less than `gap` are joined too (e.g. less than a pixel when
    shading a timeline); the result then also covers those gaps. A set already canonical comes back
    as the very arrays given (int64 ones), not a copy.
    """
    s, e = _as_int64(starts), _as_int64(ends)
    keep = e > s
    if not keep.all():
        s, e = s[keep], e[keep]
    if s.size == 0:
        return EMPTY, EMPTY
    if _canonical(s, e, gap):
        return s, e  # one stream's kernels usually are: no sort and no copy (the result is read, never written)
    order = np.argsort(s, kind="stable")
    s, e = s[order], e[order]
    reach = np.maximum.accumulate(e)  # furthest end seen so far
    new = np.empty(s.size, dtype=bool)
    new[0] = True
    new[1:] = s[1:] - reach[:-1] >= max(gap, 1)  # integers: > 0 is >= 1, so gap 0 joins touching pieces
    first = np.flatnonzero(new)
    last = np.r_[first[1:] - 1, s.size - 1]
    return s[first], reach[last]


def _canonical(s: np.ndarray, e: np.ndarray, gap: float) -> bool:
    """True when non-empty pieces are already sorted and apart by at least max(gap, 1): their own union."""
    return bool(np.all(s[1:] - e[:-1] >= max(gap, 1)))


def _sweep(a: tuple[ArrayLike, ArrayLike], b: tuple[ArrayLike, ArrayLike], keep_a: bool, keep_b: bool) -> Set:
    """Pieces where (a covers) == keep_a and (b covers) == keep_b, with at least one of them covering."""
    a_s, a_e = union(*a)
    b_s, b_e = union(*b)
    # only b's pieces that meet a change the result (and for an intersection only a's that meet b): a
    # rank's few comm pieces against its million compute ones sweep a few thousand, not two million
    b_s, b_e = _meeting(b_s, b_e, a_s, a_e)
    if keep_b:
        a_s, a_e = _meeting(a_s, a_e, b_s, b_e)
    times = np.concatenate([a_s, a_e, b_s, b_e])
    if times.size == 0:
        return EMPTY, EMPTY
    da = np.concatenate([np.ones_like(a_s), -np.ones_like(a_e), np.zeros_like(b_s), np.zeros_like(b_e)])
    db = np.concatenate([np.zeros_like(a_s), np.zeros_like(a_e), np.ones_like(b_s), -np.ones_like(b_e)])
    order = np.argsort(times, kind="stable")
    times, da, db = times[order], np.cumsum(da[order]), np.cumsum(db[order])
    # depth after all events at each distinct time
    last_at_time = np.r_[np.flatnonzero(times[1:] != times[:-1]), times.size - 1]
    t = times[last_at_time]
    flag = ((da[last_at_time] > 0) == keep_a) & ((db[last_at_time] > 0) == keep_b)
    flag &= (da[last_at_time] > 0) | (db[last_at_time] > 0)
    flag[-1] = False  # nothing is covered after the last boundary
    rises = np.flatnonzero(flag & ~np.r_[False, flag[:-1]])
    falls = np.flatnonzero(flag & ~np.r_[flag[1:], False])
    return t[rises], t[falls + 1]


def _meeting(s: np.ndarray, e: np.ndarray, other_s: np.ndarray, other_e: np.ndarray) -> Set:
    """The pieces of a canonical set that overlap the canonical other set (the very arrays when all do)."""
    if s.size == 0 or other_s.size == 0:
        return s[:0], e[:0]
    first = np.searchsorted(e, other_s, side="right")  # per other piece: the first piece ending after its start
    stop = np.searchsorted(s, other_e, side="left")  # ... and the end of the pieces starting before its end
    mark = np.zeros(s.size + 1, dtype=np.int32)
    has = stop > first
    np.add.at(mark, first[has], 1)
    np.add.at(mark, stop[has], -1)
    meets = np.cumsum(mark[:-1], dtype=np.int32) > 0
    return (s, e) if meets.all() else (s[meets], e[meets])


def intersect(a_starts: ArrayLike, a_ends: ArrayLike, b_starts: ArrayLike, b_ends: ArrayLike) -> Set:
    """Points covered by both sets."""
    return _sweep((a_starts, a_ends), (b_starts, b_ends), True, True)


def subtract(a_starts: ArrayLike, a_ends: ArrayLike, b_starts: ArrayLike, b_ends: ArrayLike) -> Set:
    """Points covered by the first set and not the second."""
    return _sweep((a_starts, a_ends), (b_starts, b_ends), True, False)


def clip(starts: ArrayLike, ends: ArrayLike, lo: int, hi: int) -> Set:
    """The set restricted to [lo, hi), empty pieces dropped (input order kept)."""
    s = np.maximum(_as_int64(starts), lo)
    e = np.minimum(_as_int64(ends), hi)
    keep = e > s
    return s[keep], e[keep]


def covered_before(set_starts: ArrayLike, set_ends: ArrayLike, t: ArrayLike) -> np.ndarray:
    """For each time in t: length of the canonical set lying before it, |set ∩ (-inf, t)|."""
    s, e, t = _as_int64(set_starts), _as_int64(set_ends), _as_int64(t)
    cumulative = np.r_[0, np.cumsum(e - s)]
    i = np.searchsorted(s, t, side="right")  # pieces starting at or before t
    inside = (i > 0) & (t < e[np.maximum(i - 1, 0)] if s.size else False)
    tail = np.where(inside, e[np.maximum(i - 1, 0)] - t if s.size else 0, 0)
    return cumulative[i] - tail


def overlap_lengths(starts: ArrayLike, ends: ArrayLike, set_starts: ArrayLike, set_ends: ArrayLike) -> np.ndarray:
    """For each interval [starts[i], ends[i]): its overlap with a canonical set."""
    s, e = _as_int64(starts), _as_int64(ends)
    return covered_before(set_starts, set_ends, np.maximum(e, s)) - covered_before(set_starts, set_ends, s)


def shared_lengths(starts: ArrayLike, ends: ArrayLike) -> np.ndarray:
    """For each interval [starts[i], ends[i]): its share of the time, the integral over it of 1 / (how many
    of the intervals cover that instant): two intervals over the same 10 ns get 5 each. Float ns."""
    s, e = _as_int64(starts), _as_int64(ends)
    e = np.maximum(e, s)
    if s.size == 0:
        return np.zeros(0)
    edges = np.unique(np.concatenate([s, e]))
    depth = np.zeros(edges.size, dtype=np.int64)
    np.add.at(depth, np.searchsorted(edges, s), 1)
    np.add.at(depth, np.searchsorted(edges, e), -1)
    depth = np.cumsum(depth)[:-1]  # intervals covering [edges[j], edges[j + 1])
    share = np.diff(edges) / np.maximum(depth, 1)
    cum = np.r_[0.0, np.cumsum(share)]
    return cum[np.searchsorted(edges, e)] - cum[np.searchsorted(edges, s)]


def contains(set_starts: ArrayLike, set_ends: ArrayLike, t: ArrayLike) -> np.ndarray:
    """For each time in t: whether it lies in the canonical set (start <= t < end)."""
    s, e, t = _as_int64(set_starts), _as_int64(set_ends), _as_int64(t)
    if s.size == 0:
        return np.zeros(t.shape, dtype=bool)
    i = np.searchsorted(s, t, side="right") - 1
    return (i >= 0) & (t < e[np.maximum(i, 0)])


def keyed_union(keys: ArrayLike, starts: ArrayLike, ends: ArrayLike) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One union per key, computed at once: returns (key, start, end) pieces sorted by key then start.

    Each key's intervals are shifted onto their own stretch of a common axis (stretches separated by a
    gap), so a single `union` there never merges pieces of different keys. Items already in that form
    (keys in order, intervals sorted and apart) come back as they are (int64 arrays: the very ones given).
    """
    k, s, e = _as_int64(keys), _as_int64(starts), _as_int64(ends)
    keep = e > s
    if not keep.all():
        k, s, e = k[keep], s[keep], e[keep]
    if k.size == 0:
        return EMPTY, EMPTY, EMPTY
    if bool(np.all(k[1:] >= k[:-1])) and _canonical(s, e, 0):
        return k, s, e  # one stream's kernels by step usually are their own pieces: no shift, sort or copy
    uniq, group = factorize(k)
    lo = np.full(uniq.size, np.iinfo(np.int64).max)
    hi = np.full(uniq.size, np.iinfo(np.int64).min)
    np.minimum.at(lo, group, s)
    np.maximum.at(hi, group, e)
    base = np.r_[0, np.cumsum(hi - lo + 1)[:-1]]
    shift = base - lo
    us, ue = union(s + shift[group], e + shift[group])
    piece_group = np.searchsorted(base, us, side="right") - 1
    return uniq[piece_group], us - shift[piece_group], ue - shift[piece_group]


def sum_by_key(keys: ArrayLike, values: ArrayLike, n_keys: int) -> np.ndarray:
    """Sum values into bins 0..n_keys-1 (exact int64)."""
    out = np.zeros(n_keys, dtype=np.int64)
    np.add.at(out, _as_int64(keys), _as_int64(values))
    return out
