"""How long each FSDP all-gather held its unit's compute stream on a GPU trace: `held_rows(trace, gathers, calls)`.

The unit's first compute kernel: the first GPU op (kernel, copy or memset) that is not communication,
launched by the thread that waited for the gather, at or after the end of the gather's wait range:
the contract's push/pop `comm_wait:all_gather:<unit>` (this project's `fsdp`; the first such range of
the rank's process for that unit opened at or after the gather's issue). `fsdp` calls `work.wait()`
inside it; on NCCL that orders the current (compute) stream after the gather's kernel
(cudaStreamWaitEvent) without blocking the host, so the first op the host launches afterwards is the
first one that can run only once the weights are there. PyTorch's FSDP2 (`torch_fsdp`, foreign FSDP2
traces) marks no such wait (its stream wait and copy-out sit inside `FSDP::pre_forward`): its gathers
get no held time (`held_ns` -1), not a guess.

    ready  = max(that op's launch, end of the op before it on its stream): when the stream could run it
    held   = max(0, gather end - ready) when the op was launched before the gather ended, else 0 (the
             host launched the unit's compute after the weights had arrived)

Also per gather, for its cause (gather_cause.py): its own kernel's launch and stream, the collective
that ran just before it on that stream (`queued_behind`, op:tag, and when it ended).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd

from analysis.measure.phases import codes, process_key, thread_key
from analysis.trace.build_frames import sort_order
from analysis.trace.frames import NVTX_PUSH_POP, Trace
from contract import ALL_GATHER, COMM_WAIT_PREFIX

WAIT_PREFIX = f"{COMM_WAIT_PREFIX}{ALL_GATHER}:"
HELD_COLUMNS = [
    "need_ns",  # end of the gather's wait range (-1: none found)
    "kernel_launch_ns",  # launch of the unit's first compute op (-1: none)
    "kernel_start_ns",
    "stream_free_ns",  # end of the op before it on its stream (-1: none)
    "ready_ns",
    "held_ns",  # -1 where not measured
    "gather_launch_ns",  # launch of the gather's own kernel (-1: unknown)
    "queue_end_ns",  # end of the op before the gather's kernel on its stream (-1: none)
    "queued_behind",  # that op as op:tag when it is a collective call, else its name ('' when none)
]


def _keys(tags: pd.Series, *others: pd.Series) -> tuple[np.ndarray, ...]:
    """The same int code for the same tag text across several series."""
    every = pd.concat([tags.astype(str), *(o.astype(str) for o in others)], ignore_index=True)
    codes_, _ = pd.factorize(every)
    out, at = [], 0
    for s in (tags, *others):
        out.append(codes_[at : at + len(s)].astype(np.int64))
        at += len(s)
    return tuple(out)


def _wait_ranges(trace: Trace) -> pd.DataFrame:
    """The `comm_wait:all_gather:<unit>` ranges: part, pid, tid, start, end, tag."""
    nvtx = trace.nvtx
    text = nvtx["text"].astype(str)
    hit = text.str.startswith(WAIT_PREFIX).to_numpy() & (codes(nvtx["kind"]) == NVTX_PUSH_POP)
    out = nvtx.loc[hit, ["part", "pid", "tid", "start", "end"]].copy()
    out["tag"] = text[hit].str.slice(len(WAIT_PREFIX)).to_numpy()
    return out


def _stream_predecessors(ops: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Per GPU op (ops' order): the end of the op before it on its stream and that op's position (-1: first)."""
    if len(ops) == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    order = sort_order(process_key(ops["part"], ops["pid"]), ops["device"].to_numpy(), ops["stream"].to_numpy(),
                       ops["start"].to_numpy())  # fmt: skip
    key = np.stack([process_key(ops["part"], ops["pid"]), ops["device"].to_numpy(), ops["stream"].to_numpy()])[:, order]
    same = np.r_[False, (key[:, 1:] == key[:, :-1]).all(axis=0)]
    pred = np.full(len(ops), -1, dtype=np.int64)
    pred[order[same]] = order[np.flatnonzero(same) - 1]
    end = ops["end"].to_numpy(np.int64)
    return np.where(pred >= 0, end[np.maximum(pred, 0)], -1), pred


def _need(trace: Trace, gathers: pd.DataFrame, where: pd.DataFrame) -> pd.DataFrame:
    """Per gather: its wait range's end and thread (need_ns, tid; -1 where none)."""
    waits = _wait_ranges(trace)
    g_tag, w_tag = _keys(gathers["tag"], waits["tag"])
    left = pd.DataFrame(
        {"k": process_key(where["part"], where["pid"]) * 1_000_003 + g_tag, "t": gathers["issue_ns"].to_numpy(np.int64)}
    )
    left["i"] = np.arange(len(left))
    right = pd.DataFrame(
        {
            "k": process_key(waits["part"], waits["pid"]) * 1_000_003 + w_tag,
            "t": waits["start"].to_numpy(np.int64),
            "need": waits["end"].to_numpy(np.int64),
            "tid": waits["tid"].to_numpy(np.int64),
        }
    )
    found = pd.merge_asof(left.sort_values("t"), right.sort_values("t"), on="t", by="k", direction="forward")
    found = found.sort_values("i")
    return pd.DataFrame(
        {
            "need_ns": found["need"].fillna(-1).to_numpy(np.int64),
            "tid": found["tid"].fillna(-1).to_numpy(np.int64),
        }
    )


def _first_compute(trace: Trace, where: pd.DataFrame, need: pd.DataFrame) -> pd.DataFrame:
    """Per gather: the first non-communication op its waiting thread launched at or after need_ns."""
    ops = trace.gpu_ops
    pred_end, _ = _stream_predecessors(ops)
    compute = ~ops["is_comm"].to_numpy(bool) & (ops["launch_start"].to_numpy() >= 0)
    right = pd.DataFrame(
        {
            "k": thread_key(ops["part"], ops["pid"], np.maximum(ops["launch_tid"], 0))[compute],
            "t": ops["launch_start"].to_numpy(np.int64)[compute],
            "start": ops["start"].to_numpy(np.int64)[compute],
            "pred_end": pred_end[compute],
        }
    ).sort_values("t", kind="stable")
    has = need["need_ns"].to_numpy() >= 0
    left = pd.DataFrame(
        {
            "k": thread_key(where["part"], where["pid"], np.maximum(need["tid"], 0)),
            "t": np.where(has, need["need_ns"], np.iinfo(np.int64).max // 2),
            "i": np.arange(len(need)),
        }
    ).sort_values("t", kind="stable")
    # merge_asof keeps the left time: the matched op's launch travels as a column of its own
    matched = pd.merge_asof(left, right.assign(launch=right["t"]), on="t", by="k", direction="forward").sort_values("i")
    ok = has & matched["launch"].notna().to_numpy()
    return pd.DataFrame(
        {
            "kernel_launch_ns": np.where(ok, matched["launch"].fillna(-1), -1).astype(np.int64),
            "kernel_start_ns": np.where(ok, matched["start"].fillna(-1), -1).astype(np.int64),
            "pred_end": np.where(ok, matched["pred_end"].fillna(-1), -1).astype(np.int64),
        }
    )


def _own_kernel(trace: Trace, gathers: pd.DataFrame, where: pd.DataFrame, calls: pd.DataFrame) -> pd.DataFrame:
    """Per gather: its kernel's launch, the end of the op before it on its stream and what that op was."""
    ops = trace.gpu_ops
    pred_end, pred = _stream_predecessors(ops)
    comm = ops["is_comm"].to_numpy(bool)
    table = pd.DataFrame(
        {
            "part": ops["part"].to_numpy(np.int64)[comm],
            "pid": ops["pid"].to_numpy(np.int64)[comm],
            "device": ops["device"].to_numpy(np.int64)[comm],
            "start_ns": ops["start"].to_numpy(np.int64)[comm],
            "gather_launch_ns": ops["launch_start"].to_numpy(np.int64)[comm],
            "queue_end_ns": pred_end[comm],
            "pred": pred[comm],
        }
    ).drop_duplicates(["part", "pid", "device", "start_ns"])
    mine = where[["part", "pid", "device"]].assign(start_ns=gathers["start_ns"].to_numpy(np.int64))
    got = mine.merge(table, on=["part", "pid", "device", "start_ns"], how="left")
    pred_at = got["pred"].fillna(-1).to_numpy(np.int64)
    return got.assign(
        gather_launch_ns=got["gather_launch_ns"].fillna(-1).astype(np.int64),
        queue_end_ns=got["queue_end_ns"].fillna(-1).astype(np.int64),
        queued_behind=_named(trace, pred_at, calls),
    )[["gather_launch_ns", "queue_end_ns", "queued_behind"]]


def _named(trace: Trace, at: np.ndarray, calls: pd.DataFrame) -> np.ndarray:
    """op:tag of the collective call whose kernel is gpu_ops row `at`, else the op's name; '' for -1."""
    ops = trace.gpu_ops
    has = at >= 0
    pick = ops.iloc[at[has]]
    keys = pd.DataFrame({"pid": pick["pid"].to_numpy(np.int64), "start_ns": pick["start"].to_numpy(np.int64)})
    named = calls.assign(name=calls["op"].astype(str) + ":" + calls["tag"].astype(str))
    ranks = trace.ranks[["rank", "pid"]].drop_duplicates("rank")
    named = named.merge(ranks, on="rank")[["pid", "start_ns", "name"]].drop_duplicates(["pid", "start_ns"])
    found = keys.merge(named, on=["pid", "start_ns"], how="left")["name"]
    out = np.full(len(at), "", dtype=object)
    out[has] = np.where(found.notna(), found.astype(object), pick["name"].astype(str).to_numpy())
    return out


def held_rows(trace: Trace, gathers: pd.DataFrame, calls: pd.DataFrame) -> pd.DataFrame:
    """HELD_COLUMNS of each all-gather call in `gathers` (rank, tag, issue_ns, start_ns, end_ns), in its
    order; `calls`: every collective call of the trace (rank, op, tag, start_ns) to name the queue."""
    if len(gathers) == 0:  # nothing to look up: the same empty columns without sorting every GPU op (a DDP trace)
        trace = replace(trace, gpu_ops=trace.gpu_ops.iloc[:0])
    ranks = trace.ranks[["rank", "part", "pid", "device"]].drop_duplicates("rank")
    where = gathers[["rank"]].merge(ranks, on="rank", how="left")
    need = _need(trace, gathers, where)
    first = _first_compute(trace, where, need)
    end = gathers["end_ns"].to_numpy(np.int64)
    launch = first["kernel_launch_ns"].to_numpy()
    ready = np.maximum(launch, first["pred_end"].to_numpy())
    measured = launch >= 0
    held = np.where(measured, np.where(launch < end, np.maximum(end - ready, 0), 0), -1)
    own = _own_kernel(trace, gathers, where, calls)
    return pd.DataFrame(
        {
            "need_ns": need["need_ns"].to_numpy(),
            "kernel_launch_ns": launch,
            "kernel_start_ns": first["kernel_start_ns"].to_numpy(),
            "stream_free_ns": first["pred_end"].to_numpy(),
            "ready_ns": np.where(measured, ready, -1),
            "held_ns": held.astype(np.int64),
            "gather_launch_ns": own["gather_launch_ns"].to_numpy(),
            "queue_end_ns": own["queue_end_ns"].to_numpy(),
            "queued_behind": own["queued_behind"].to_numpy(),
        }
    )
