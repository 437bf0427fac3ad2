"""Helpers both readers use to build the frames: joining per-file columns, sorting,
numbering ranks, matching GPU work to its launch call."""

from __future__ import annotations

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike
from pandas.api.types import union_categoricals

from analysis.frames.trace import GPU_KINDS

GPU_INT_COLUMNS = ["pid", "start", "end", "device", "stream", "correlation_id", "launch_start", "launch_tid"]


def factorize(keys: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    """(sorted distinct keys, index of each key among them), like np.unique(return_inverse=True)
    but O(n) when the keys span a small range (step numbers, string ids), the common case here."""
    k = np.asarray(keys, dtype=np.int64).reshape(-1)
    if k.size == 0:
        return k, k
    lo, hi = int(k.min()), int(k.max())
    if hi - lo > 4 * k.size + 1024:
        return np.unique(k, return_inverse=True)
    present = np.zeros(hi - lo + 1, dtype=bool)
    present[k - lo] = True
    position = np.cumsum(present) - 1
    return np.flatnonzero(present) + lo, position[k - lo]


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


def ops_frame(parts: list[dict]) -> pd.DataFrame:
    """The gpu_ops frame: columns of every file joined, sorted by (part, pid, device, start)."""
    cols = {c: np.concatenate([p[c] for p in parts]) for c in ["part", *GPU_INT_COLUMNS, "kind"]}
    names = union_categoricals([p["name"] for p in parts]) if len(parts) > 1 else parts[0]["name"]
    order = np.lexsort((cols["start"], cols["device"], cols["pid"], cols["part"]))
    frame = pd.DataFrame(
        {
            c: cols[c][order]
            for c in ["part", "pid", "device", "stream", "start", "end", "correlation_id", "launch_start", "launch_tid"]
        },
        copy=False,
    )  # the arrays are fresh: consolidating them would copy 1M rows again
    frame.insert(7, "name", pd.Categorical.from_codes(names.codes[order], categories=names.categories))
    frame.insert(8, "kind", pd.Categorical.from_codes(cols["kind"][order], categories=GPU_KINDS))
    # a collective's bytes where the file records them on the kernel (Kineto's NCCL kernel args), else -1
    sizes = [p.get("comm_bytes", np.full(len(p["start"]), -1, dtype=np.int64)) for p in parts]
    frame["comm_bytes"] = np.concatenate(sizes).astype(np.int64)[order]
    return frame


def nvtx_frame(parts: list[pd.DataFrame]) -> pd.DataFrame:
    """The nvtx frame: every file's ranges joined, sorted by (part, pid, start)."""
    nvtx = pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0]
    nvtx = nvtx.take(np.lexsort((nvtx["start"].to_numpy(), nvtx["pid"].to_numpy(), nvtx["part"].to_numpy())))
    return nvtx.reset_index(drop=True)


def number_ranks(ops: pd.DataFrame, nvtx: pd.DataFrame, meta: dict, implementation: str) -> pd.DataFrame:
    """One row per (part, pid, device); rank from `ddp.meta` when every rank has a distinct one, else device order."""
    if len(ops):
        ranks = ops[["part", "pid", "device"]].drop_duplicates()
    else:
        ranks = nvtx.loc[nvtx["kind"] != "mark", ["part", "pid"]].drop_duplicates().assign(device=-1)
    ranks = ranks.sort_values(["device", "part", "pid"]).reset_index(drop=True)
    from_meta = [meta.get((int(p), int(q)), {}).get("rank") for p, q in zip(ranks["part"], ranks["pid"], strict=True)]
    usable = all(isinstance(r, int) for r in from_meta) and len(set(from_meta)) == len(from_meta)
    ranks.insert(0, "rank", from_meta if usable else range(len(ranks)))
    ranks["implementation"] = implementation
    return ranks.sort_values("rank").reset_index(drop=True).astype({"rank": np.int64})
