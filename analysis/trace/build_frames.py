"""Building the frames (frames.py) from what the readers read, the same for both formats: the per-file
columns joined and sorted (`ops_frame`, `nvtx_frame`), ranks numbered (`number_ranks`), GPU work matched
to its launch call (`LaunchJoin`, `row_lookup`). Its keyed-array helpers (`factorize`, `group_index`,
`sort_order`, `rank_rows`) serve the measure core too."""

from __future__ import annotations

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike
from pandas.api.types import union_categoricals

from analysis.machine import release_free_memory
from analysis.trace.frames import GPU_KINDS

GPU_INT_COLUMNS = ["pid", "start", "end", "device", "stream", "correlation_id", "launch_start", "launch_tid"]


def factorize(keys: ArrayLike, compact: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(sorted distinct keys, index of each key among them), like np.unique(return_inverse=True)
    but O(n) when the keys span a small range (step numbers, string ids, process ids), the common
    case here; integer keys are offset in their own width there (no int64 copy of 10M int32 ids).
    `compact`: in that case the index in the smallest integer type holding it (int8 for a few keys)."""
    k = np.asarray(keys).reshape(-1)
    if k.dtype.kind not in "iu":
        k = k.astype(np.int64)
    if k.size == 0:
        return k.astype(np.int64), np.zeros(0, dtype=np.intp)
    lo, hi = int(k.min()), int(k.max())
    if hi - lo > 4 * k.size + 1024:
        uniq, inverse = np.unique(k.astype(np.int64, copy=False), return_inverse=True)
        return uniq, inverse.reshape(-1)
    if lo == hi:
        return np.array([lo], dtype=np.int64), np.zeros(k.size, dtype=np.int8 if compact else np.intp)
    offset = k - k.dtype.type(lo) if np.can_cast(np.min_scalar_type(lo), k.dtype) else k.astype(np.int64) - lo
    present = np.zeros(hi - lo + 1, dtype=bool)
    present[offset] = True
    position = np.cumsum(present, dtype=np.intp) - 1
    if compact:
        position = smallest_int(position)
    return np.flatnonzero(present).astype(np.int64) + lo, position[offset]


def group_index(*keys: np.ndarray) -> np.ndarray:
    """An id per distinct combination of the keys, per row, as groupby(keys).ngroup() gives one (not the
    same numbers: below the product of the keys' distinct counts, renumbered densely where that product
    is larger than the rows), in the combinations' lexicographic order (sort_order relies on it): from
    each key's factorize, in O(n) and without copying a frame. A key with one value is skipped."""
    group, n = np.zeros(len(keys[0]), dtype=np.int64), 1
    for key in keys:
        uniq, inverse = factorize(key, compact=True)  # added into group: a narrow index is enough
        if len(uniq) == 1:
            continue
        if n * len(uniq) >= 1 << 62:  # the combinations so far renumbered densely first
            uniq_groups, group = factorize(group)
            n = len(uniq_groups)
        group *= len(uniq)
        group += inverse
        n *= len(uniq)
    return group if n <= len(group) + 1024 else factorize(group)[1]


def row_lookup(rt_pid: np.ndarray, rt_corr: np.ndarray, pid: np.ndarray, corr: np.ndarray) -> np.ndarray:
    """For each (pid, corr): index of the runtime row with the same pair, else -1.

    CUDA correlation ids are dense counters, so a direct-address table over (process, id) is usually
    small and beats sorting 1M keys; when the ids are too sparse, fall back to sort + binary search.
    """
    pids = pd.Index(pd.unique(rt_pid))
    rt_p, op_p = pids.get_indexer(rt_pid), pids.get_indexer(pid)
    lo, hi = int(rt_corr.min()), int(rt_corr.max())
    span = hi - lo + 1
    valid = (op_p >= 0) & (corr >= lo) & (corr <= hi)
    if len(pids) * span <= 4 * (len(rt_pid) + len(pid)) + 4096:
        table = np.full(len(pids) * span, -1, dtype=np.int64)
        table[rt_p * span + (rt_corr - lo)] = np.arange(len(rt_pid))
        return np.where(valid, table[np.where(valid, op_p * span + (corr - lo), 0)], -1)
    rt_key = (rt_p.astype(np.int64) << 32) | (rt_corr & 0xFFFFFFFF)  # pid index, 32-bit id
    order = np.argsort(rt_key, kind="stable")
    op_key = (op_p.astype(np.int64) << 32) | (corr & 0xFFFFFFFF)
    pos = np.minimum(np.searchsorted(rt_key[order], op_key), len(order) - 1)
    return np.where(valid & (rt_key[order][pos] == op_key), order[pos], -1)


class LaunchJoin:
    """Each GPU op's launch: the runtime call with the same (process, correlation id), filled from the
    runtime rows batch by batch (`add`) so the runtime table is never held whole; where two calls share
    the pair, the one added last wins. Ops without a correlation id (< 0) match nothing."""

    def __init__(self, pid: np.ndarray, corr: np.ndarray):
        self._pids, op_p = factorize(pid)  # a handful of processes
        ok = corr >= 0
        self._lo = int(corr[ok].min()) if ok.any() else 0
        self._span = (int(corr[ok].max()) - self._lo + 1) if ok.any() else 1
        self._dense = len(self._pids) * self._span <= 2 * len(pid) + 4096
        if self._dense:  # correlation ids are dense counters: a slot per (process, id) in the ops' range
            slot = op_p  # computed in place: at 10M ops every temporary array is 80 MB
            slot *= self._span
            slot += corr
            slot -= self._lo
            self._slots_n = len(self._pids) * self._span
        else:  # too sparse: a slot per distinct (process, id) of the ops, found by binary search
            self._keys, slot = np.unique(_pair_key(op_p, corr), return_inverse=True)
            slot = slot.reshape(-1)
            self._slots_n = len(self._keys)
        slot[~ok] = -1
        self._op_slot = slot.astype(np.int32) if self._slots_n < 2**31 else slot
        self._start = np.full(self._slots_n, -1, dtype=np.int64)
        self._tid = np.full(self._slots_n, -1, dtype=np.int32)

    def add(self, rt_pid: np.ndarray, rt_corr: np.ndarray, rt_start: np.ndarray, rt_tid: np.ndarray) -> None:
        """Record a batch of runtime calls (their process, correlation id, start and OS thread id)."""
        p = np.minimum(np.searchsorted(self._pids, rt_pid), len(self._pids) - 1)
        valid = self._pids[p] == rt_pid
        if self._dense:
            valid &= (rt_corr >= self._lo) & (rt_corr < self._lo + self._span)
            slot = p.astype(np.int64) * self._span + (rt_corr - self._lo)
        else:
            key = _pair_key(p, rt_corr)
            slot = np.minimum(np.searchsorted(self._keys, key), len(self._keys) - 1)
            valid &= self._keys[slot] == key
        self._start[slot[valid]] = rt_start[valid]
        self._tid[slot[valid]] = rt_tid[valid]

    def result(self) -> tuple[np.ndarray, np.ndarray]:
        """(launch_start int64, launch_tid int32) per op; -1 where no runtime call matched."""
        found = self._op_slot >= 0
        if self._slots_n == 0:
            return np.full(len(found), -1, dtype=np.int64), np.full(len(found), -1, dtype=np.int32)
        slot = np.where(found, self._op_slot, 0)
        start, tid = self._start[slot], self._tid[slot]
        start[~found], tid[~found] = -1, -1
        return start, tid


def _pair_key(p: np.ndarray, corr: np.ndarray) -> np.ndarray:
    return (p.astype(np.int64) << 32) | (np.asarray(corr, dtype=np.int64) & 0xFFFFFFFF)  # process index, 32-bit id


# Identifier columns of gpu_ops, stored as int32 when every value fits (process and thread ids are 24-bit
# in nsys): with the int64 times they are what a kernel costs in memory. File parts, devices and streams
# are few and small: they take the smallest integer type that holds them (smallest_int), int8 mostly.
NARROW_COLUMNS = ("pid", "correlation_id", "launch_tid")
SMALLEST_COLUMNS = ("part", "device", "stream")


def sort_order(*keys: np.ndarray) -> np.ndarray:
    """The stable order of rows by the keys, most significant first (the last one a time), as
    np.lexsort(keys[::-1]) gives it, from one int64 key (group number x time span + time) when that
    fits, which sorts several times faster."""
    *groups, start = (np.asarray(k) for k in keys)
    if len(start) == 0:
        return np.zeros(0, dtype=np.int64)
    group = group_index(*groups) if groups else np.zeros(len(start), dtype=np.int64)
    n_groups = int(group.max()) + 1
    lo, span = int(start.min()), int(start.max()) - int(start.min()) + 1
    if n_groups * span >= 1 << 62:
        return np.lexsort(tuple(np.asarray(k) for k in keys[::-1]))
    group *= span
    # + (start - lo) in place (`+= start - lo` made a temporary of every row), in the order that cannot
    # overflow int64: group x span < 2**62, so - lo first when lo >= 0, else + start first (start < span)
    if lo >= 0:
        group -= lo
        group += start
    else:
        group += start
        group -= lo
    return np.argsort(group, kind="stable")


def _narrow(values: np.ndarray) -> np.ndarray:
    info = np.iinfo(np.int32)
    fits = values.size == 0 or (info.min <= values.min() and values.max() <= info.max)
    return values.astype(np.int32 if fits else np.int64, copy=False)


def smallest_int(values: np.ndarray) -> np.ndarray:
    """values as the smallest of int8, int16, int32 and int64 that holds every one and the span between
    them (so that an offset from the least, as factorize takes, cannot wrap); no copy when that is theirs."""
    if values.size == 0:
        return values.astype(np.int8, copy=False)
    low, high = int(values.min()), int(values.max())
    top = max(high, high - low)
    fitting = (t for t in (np.int8, np.int16, np.int32) if np.iinfo(t).min <= low and top <= np.iinfo(t).max)
    return values.astype(next(fitting, np.int64), copy=False)


def _stored(column: str, values: np.ndarray) -> np.ndarray:
    """A gpu_ops column's values in the integer type it is kept in (the values themselves for times)."""
    if column in NARROW_COLUMNS:
        return _narrow(values)
    return smallest_int(values) if column in SMALLEST_COLUMNS else values


def _taken(parts: list[dict], column: str) -> np.ndarray:
    """One column of every part, joined; the parts let go of it (memory holds one copy of the rows)."""
    return parts[0].pop(column) if len(parts) == 1 else np.concatenate([p.pop(column) for p in parts])


def ops_frame(parts: list[dict]) -> pd.DataFrame:
    """The gpu_ops frame: columns of every file joined, sorted by (part, pid, device, start); identifier
    columns int32 where they fit (NARROW_COLUMNS) or smaller (SMALLEST_COLUMNS). The parts' columns are
    taken from them as they are used."""
    lengths = [len(p["start"]) for p in parts]
    keys = {c: _taken(parts, c) for c in ("part", "pid", "device", "start")}
    order = sort_order(keys["part"], keys["pid"], keys["device"], keys["start"])
    columns = ["part", "pid", "device", "stream", "start", "end", "correlation_id", "launch_start", "launch_tid"]
    data = {}
    for c in columns:
        values = keys.pop(c) if c in keys else _taken(parts, c)
        data[c] = _stored(c, values)[order]
        del values
    frame = pd.DataFrame(data, copy=False)  # the arrays are fresh: consolidating them would copy every row again
    del data
    names = union_categoricals([p["name"] for p in parts]) if len(parts) > 1 else parts[0]["name"]
    frame.insert(7, "name", pd.Categorical.from_codes(names.codes[order], categories=names.categories))
    kind = parts[0]["kind"] if len(parts) == 1 else np.concatenate([p["kind"] for p in parts])
    frame.insert(8, "kind", pd.Categorical.from_codes(kind[order], categories=GPU_KINDS))
    # a collective's bytes where the file records them on the kernel (Kineto's NCCL kernel args), else -1;
    # in the smallest integer type holding them: int8 (1 byte a kernel, not 8) where none is recorded
    if any("comm_bytes" in p for p in parts):
        sizes = [p.get("comm_bytes", np.full(n, -1, dtype=np.int8)) for p, n in zip(parts, lengths, strict=True)]
        frame["comm_bytes"] = smallest_int(np.concatenate(sizes))[order]
    else:
        frame["comm_bytes"] = np.full(len(order), -1, dtype=np.int8)
    del order
    release_free_memory()  # the sort's temporaries and the parts' columns, all of them gone now
    return frame


def nvtx_frame(parts: list[pd.DataFrame]) -> pd.DataFrame:
    """The nvtx frame: every file's ranges joined, sorted by (part, pid, start)."""
    nvtx = pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0]
    nvtx = nvtx.take(np.lexsort((nvtx["start"].to_numpy(), nvtx["pid"].to_numpy(), nvtx["part"].to_numpy())))
    return nvtx.reset_index(drop=True)


def rank_rows(ops: pd.DataFrame) -> dict[tuple[int, int, int], slice | np.ndarray]:
    """(part, pid, device) -> its rows: a slice, found from where the keys change (gpu_ops is sorted by
    them, ops_frame, so each rank's rows are one run; indexing a column by a slice gives a view, and no
    array of positions is made), or in a frame where they are not one run, the positions groupby(...).indices gives."""
    if len(ops) == 0:
        return {}
    part, pid, device = (ops[c].to_numpy() for c in ("part", "pid", "device"))
    change = np.flatnonzero((part[1:] != part[:-1]) | (pid[1:] != pid[:-1]) | (device[1:] != device[:-1])) + 1
    starts, ends = np.r_[0, change], np.r_[change, len(part)]
    keys = list(zip(part[starts].tolist(), pid[starts].tolist(), device[starts].tolist(), strict=True))
    if len(set(keys)) < len(keys):
        found = ops.groupby(["part", "pid", "device"], sort=False).indices
        return {(int(a), int(b), int(c)): rows for (a, b, c), rows in found.items()}
    return {k: slice(a, b) for k, a, b in zip(keys, starts.tolist(), ends.tolist(), strict=True)}


def number_ranks(ops: pd.DataFrame, nvtx: pd.DataFrame, meta: dict, implementation: str) -> pd.DataFrame:
    """One row per (part, pid, device); rank from `ddp.meta` when every rank has a distinct one, else device order."""
    if len(ops):
        ranks = pd.DataFrame(list(rank_rows(ops)), columns=["part", "pid", "device"])
    else:
        ranks = nvtx.loc[nvtx["kind"] != "mark", ["part", "pid"]].drop_duplicates().assign(device=-1)
    ranks = ranks.sort_values(["device", "part", "pid"]).reset_index(drop=True)
    from_meta = [meta.get((int(p), int(q)), {}).get("rank") for p, q in zip(ranks["part"], ranks["pid"], strict=True)]
    usable = all(isinstance(r, int) for r in from_meta) and len(set(from_meta)) == len(from_meta)
    ranks.insert(0, "rank", from_meta if usable else range(len(ranks)))
    ranks["implementation"] = implementation
    ranks = ranks.sort_values("rank").reset_index(drop=True)
    return ranks.astype({"rank": np.int64, "part": np.int64, "pid": np.int64, "device": np.int64})


def categorical_names(ids: np.ndarray, strings: dict[int, str], missing: str | None = None) -> pd.Categorical:
    """Map string ids to a categorical (plain object categories) without a per-row Python loop."""
    if ids.dtype == object:  # inline strings (rare): nothing to look up
        uniq, inverse = np.unique(ids.astype(str), return_inverse=True)
    else:
        uniq, inverse = factorize(ids)
    texts = [
        strings.get(int(u), f"<string {u}>" if missing is None else missing) if not isinstance(u, str) else u
        for u in uniq
    ]
    codes_of_uniq, categories = pd.factorize(np.array(texts, dtype=object))
    return pd.Categorical.from_codes(codes_of_uniq[inverse.reshape(-1)], categories=pd.Index(categories, dtype=object))
