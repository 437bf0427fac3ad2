"""The sharded layout's spans from one recorded fsdp / torch_fsdp run: `unit_spans` (per rank, step,
phase and unit: when the unit needed its weights, when it resumed, its post-hook) and `phase_windows`.

need / resume of a unit's all-gather (the first wait for it on the rank at or after its issue):
  CPU traces (calls from ranges): the push/pop `comm_wait:all_gather:<unit>` range's start / end
      (fsdp marks its wait there); without one (FSDP2 on CPU gathers synchronously) the gather's
      issue / end.
  GPU traces (calls from kernels): gather_held.py's ready (when the unit's compute stream could run its
      first kernel) and ready + held; without a wait range (FSDP2), the gather's issue / max(issue, end).
post-hook (where the unit's own compute ends and its collectives are issued):
  CPU, backward: the issue of the unit's reduce-scatter; CPU, forward: the issue of the all-gather
      `prefetch` (recorded) units later, where there is one; otherwise, and on GPU traces, the next
      unit's need (the glue is then 0).
The compute spans (resume to post-hook: `own`; post-hook to the next need: `glue`) exclude the rank's
blocking `comm_wait:reduce_scatter` ranges inside them (fsdp waiting for a gradient buffer), which the
replay models itself.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.fsdp_units.gather_held import held_rows
from analysis.measure import intervals as iv
from analysis.measure.phases import codes, process_key, ranges_named
from analysis.trace.frames import NVTX_PUSH_POP, Trace
from analysis.trace.patterns import Patterns
from contract import ALL_GATHER, COMM_WAIT_PREFIX, REDUCE_SCATTER

GATHER_WAIT = f"{COMM_WAIT_PREFIX}{ALL_GATHER}:"
SCATTER_WAIT = f"{COMM_WAIT_PREFIX}{REDUCE_SCATTER}:"
SPAN_COLUMNS = ["rank", "step", "phase", "unit", "k", "need", "resume", "post", "next_need"]


def _waits(trace: Trace, prefix: str) -> pd.DataFrame:
    """key (process), tag, start, end of the push/pop ranges named prefix + tag."""
    nvtx = trace.nvtx
    text = nvtx["text"].astype(str)
    hit = text.str.startswith(prefix).to_numpy() & (codes(nvtx["kind"]) == NVTX_PUSH_POP)
    own = nvtx[hit]
    return pd.DataFrame(
        {
            "key": process_key(own["part"], own["pid"]),
            "tag": text[hit].str.slice(len(prefix)).to_numpy(dtype=object),
            "start": own["start"].to_numpy(np.int64),
            "end": own["end"].to_numpy(np.int64),
        }
    )


def _keys(trace: Trace, rank: pd.Series) -> np.ndarray:
    ranks = trace.ranks[["rank", "part", "pid"]].drop_duplicates("rank")
    where = rank.to_frame("rank").merge(ranks, on="rank", how="left")
    return process_key(where["part"].fillna(-1), where["pid"].fillna(-1))


def gathers_block(trace: Trace) -> bool:
    """Whether a CPU trace's all-gathers block the rank's compute from issue to end: none has a marked
    wait (FSDP2 on CPU gathers synchronously: no overlap with compute is recorded, whatever the prefetch)."""
    return _waits(trace, GATHER_WAIT).empty


def _cpu_need(trace: Trace, gathers: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """need, resume per gather from the first `comm_wait:all_gather:<unit>` range at or after its issue."""
    waits = _waits(trace, GATHER_WAIT)
    issue, end = gathers["issue_ns"].to_numpy(float), gathers["end_ns"].to_numpy(float)
    if waits.empty:  # gathers_block: the gather is the wait
        return issue, np.maximum(issue, end)
    codes_, _ = pd.factorize(np.r_[gathers["unit"].astype(str).to_numpy(dtype=object), waits["tag"].to_numpy()])
    left = pd.DataFrame(
        {"key": _keys(trace, gathers["rank"]), "tag": codes_[: len(gathers)],
         "t": gathers["issue_ns"].to_numpy(np.int64), "i": np.arange(len(gathers))}
    ).sort_values("t")  # fmt: skip
    right = waits.assign(tag=codes_[len(gathers) :], need=waits["start"]).rename(columns={"start": "t"})
    found = pd.merge_asof(left, right.sort_values("t"), on="t", by=["key", "tag"], direction="forward")
    found = found.sort_values("i")
    has = found["need"].notna().to_numpy()
    need = np.where(has, found["need"].to_numpy(float), issue)
    resume = np.where(has, found["end"].to_numpy(float), np.maximum(issue, end))
    return need, resume


def _gpu_need(trace: Trace, gathers: pd.DataFrame, calls: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """need, resume per gather from gather_held.py (ready, ready + held)."""
    named = calls[["rank", "op", "tag", "start_ns"]]
    held = held_rows(trace, gathers.drop(columns="tag").rename(columns={"unit": "tag"}), named)
    ok = held["held_ns"].to_numpy() >= 0
    issue, end = gathers["issue_ns"].to_numpy(float), gathers["end_ns"].to_numpy(float)
    ready = held["ready_ns"].to_numpy(float)
    need = np.where(ok, ready, issue)
    resume = np.where(ok, ready + held["held_ns"].to_numpy(float), np.maximum(issue, end))
    return need, resume


def unit_spans(trace: Trace, calls: pd.DataFrame, order: list[str], gpu: bool, prefetch: int) -> pd.DataFrame:
    """SPAN_COLUMNS: per rank, step, phase and position k in the phase's unit order (forward: `order`,
    backward: reversed), its unit's index in `order`, need, resume, post-hook and the next unit's need
    (NaN for the last: the caller closes it with the phase's end). `calls`: the run's collective calls
    (collective_calls.CALL_COLUMNS) in steps, phases as issued."""
    index = {u: i for i, u in enumerate(order)}
    ag = calls[(calls["op"] == ALL_GATHER) & calls["phase"].isin(["forward", "backward"]) & calls["tag"].isin(index)]
    ag = (
        ag.assign(unit=ag["tag"].astype(str)).sort_values("issue_ns").drop_duplicates(["rank", "step", "phase", "unit"])
    )
    ag = ag.reset_index(drop=True)
    need, resume = _gpu_need(trace, ag, calls) if gpu else _cpu_need(trace, ag)
    spans = ag[["rank", "step", "phase", "unit"]].assign(unit=ag["unit"].map(index), need=need, resume=resume)
    backward = spans["phase"].to_numpy() == "backward"
    # position in the phase's order (backward: reverse forward order, over the units it gathers: FSDP2's
    # root is gathered in forward only)
    spans["k"] = np.where(backward, -spans["unit"], spans["unit"])
    spans = spans.sort_values(["rank", "step", "phase", "k"]).reset_index(drop=True)
    spans["k"] = spans.groupby(["rank", "step", "phase"]).cumcount()
    nxt = spans.groupby(["rank", "step", "phase"])["need"].shift(-1)
    spans["next_need"] = nxt.to_numpy(float)
    post = spans["next_need"].to_numpy(float).copy()
    if not gpu:
        post = _cpu_posts(spans, ag, calls, order, prefetch, post)
    spans["post"] = np.clip(post, spans["resume"], np.where(np.isnan(spans["next_need"]), np.inf, spans["next_need"]))
    return spans[SPAN_COLUMNS]


def _cpu_posts(
    spans: pd.DataFrame, ag: pd.DataFrame, calls: pd.DataFrame, order: list[str], prefetch: int, post: np.ndarray
) -> np.ndarray:
    """CPU post-hooks: backward from the unit's reduce-scatter issue, forward from the issue of the
    gather `prefetch` units later; `post` (the next need) elsewhere."""
    index = {u: i for i, u in enumerate(order)}
    rs = calls[(calls["op"] == REDUCE_SCATTER) & calls["tag"].isin(index)]
    rs = rs.groupby(["rank", "step", "tag"], as_index=False)["issue_ns"].min()
    rs = rs.assign(unit=rs["tag"].map(index), phase="backward").rename(columns={"issue_ns": "p"})
    fwd = ag[ag["phase"] == "forward"].assign(unit=lambda f: f["unit"].map(index) - prefetch)
    fwd = fwd[fwd["unit"] >= 0].rename(columns={"issue_ns": "p"})[["rank", "step", "phase", "unit", "p"]]
    both = pd.concat([rs[["rank", "step", "phase", "unit", "p"]], fwd], ignore_index=True)
    got = spans[["rank", "step", "phase", "unit"]].merge(both, on=["rank", "step", "phase", "unit"], how="left")
    return np.where(got["p"].notna(), got["p"].to_numpy(float), post)


def blocked_inside(trace: Trace, rank: pd.Series, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Per interval [lo, hi) of a rank: the time in its `comm_wait:reduce_scatter` ranges (blocking)."""
    waits = _waits(trace, SCATTER_WAIT)
    return _time_inside(_keys(trace, rank), lo, hi, waits, waits["key"].to_numpy())


def comm_beside(served: pd.DataFrame, rank: pd.Series, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Per interval [lo, hi) of a rank: the time some of its collectives were in flight (served: rank,
    start, end of each call's service)."""
    return _time_inside(rank.to_numpy(), lo, hi, served, served["rank"].to_numpy())


def _time_inside(
    keys: np.ndarray, lo: np.ndarray, hi: np.ndarray, ranges: pd.DataFrame, range_keys: np.ndarray
) -> np.ndarray:
    """Per interval [lo, hi) (NaN ends: 0) of key keys[i]: its overlap with the union of the `ranges`
    (start, end) whose range_keys equal that key; one pass per key (a rank)."""
    out = np.zeros(len(lo))
    for key in np.unique(keys):
        mine = keys == key
        own = ranges[range_keys == key]
        s, e = iv.union(own["start"].to_numpy(np.int64), own["end"].to_numpy(np.int64))
        a, b = lo[mine], np.maximum(hi[mine], lo[mine])
        ok = ~(np.isnan(a) | np.isnan(b))
        got = np.zeros(a.size)
        got[ok] = iv.overlap_lengths(a[ok].astype(np.int64), b[ok].astype(np.int64), s, e)
        out[mine] = got
    return out


def phase_windows(trace: Trace, patterns: Patterns, works: list, name: str) -> pd.DataFrame:
    """rank, step, lo, hi of each `name` (forward/backward) range, its step by the rank's step windows."""
    from analysis.measure.phases import window_index

    ranges = ranges_named(trace.nvtx, patterns.regex(name))
    frames = []
    for w in works:  # one per rank
        own = ranges[(ranges["part"].to_numpy() == w.part) & (ranges["pid"].to_numpy() == w.pid)]
        at = window_index(w.windows, own["start"].to_numpy())
        keep = at >= 0
        steps = w.windows["step"].to_numpy()[at[keep]]
        frames.append(
            pd.DataFrame({"rank": w.rank, "step": steps, "lo": own["start"].to_numpy()[keep],
                          "hi": own["end"].to_numpy()[keep]})
        )  # fmt: skip
    out = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=["rank", "step", "lo", "hi"])
    return out.groupby(["rank", "step"], as_index=False).agg(lo=("lo", "min"), hi=("hi", "max"))
