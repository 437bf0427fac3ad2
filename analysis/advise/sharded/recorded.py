"""The sharded layout's inputs from one loaded fsdp / torch_fsdp run: `recorded_shard(loaded, impl)`.

Per rank-step (S steps, R ranks) the phases' compute around each unit's wait (spans.py),
the rest of the step, the collectives' service times (for the cost fits) and each compute span's
communication beside it (for the slowdown fit); the recorded setting from `ddp.meta` or the
strategy's default. See docs/advise.md ("Sharded runs").
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from analysis.advise.comm_cost import transfer_times
from analysis.advise.recorded import every_rank, run_meta
from analysis.advise.sharded.replay import Setting
from analysis.advise.sharded.spans import blocked_inside, comm_beside, gathers_block, phase_windows, unit_spans
from analysis.errors import TraceError
from analysis.measure.call_groups import world_size
from analysis.measure.rank_periods import backward_windows
from analysis.overlap.metrics import measure_trace
from analysis.run.loaded_run import LoadedRun
from analysis.trace.frames import KERNELS, NS_PER_MS, Trace
from contract import ALL_GATHER, ALL_REDUCE, REDUCE_SCATTER, SHARDING_KEY

DEFAULT_PREFETCH = {"fsdp": 2, "torch_fsdp": 1}  # fsdp's constructor default; FSDP2's implicit prefetch of one
GLOO_LANES = 2  # ProcessGroupGloo runs this many collectives at once (its worker threads, Options.threads)
# ProcessGroupGloo's reduce_scatter_tensor is an all-reduce of the whole input (a reduce-scatter phase, then an
# all-gather phase, each moving what an all-gather of as many bytes moves), and its handle completes only when
# waited for: fsdp's range ends at that wait, so on gloo its cost is taken as this many all-gathers of its bytes
GLOO_SCATTER_PHASES = 2.0


@dataclass(frozen=True)
class ShardRecorded:
    """One run's replay inputs, each (S, R[, U]) in step-then-rank order; units in forward order."""

    implementation: str
    setting: Setting
    setting_source: str  # "ddp.meta" or why it was inferred
    gpu: bool
    lanes: int
    units: list[str]
    backward_units: np.ndarray  # indices of the units backward gathers, in its order
    steps: np.ndarray  # (S,) step numbers
    step_ns: np.ndarray
    other: np.ndarray
    gap: np.ndarray
    offset: np.ndarray  # (S, R) each rank's forward start after the first rank's
    spans: dict  # phase -> lead, own, glue, their communication beside (*_beside), own/glue_typical (slowdown.py)
    recorded_wait: dict  # phase -> (S, R, U) the recorded wait (resume - need)
    gather_bytes: np.ndarray  # (U,)
    scatter_bytes: np.ndarray  # (U,)
    reduce_bytes: list[list[float]]  # per unit: the all-reduces issued in its backward span
    served: pd.DataFrame  # step, op, bytes, transfer_ns of every paired call
    exposed_ms: float  # the recorded waits and tail, per rank-step
    scatter_as_all_reduce: bool = False  # gloo (fsdp): reduce-scatters priced as GLOO_SCATTER_PHASES all-gathers
    backward_issue: np.ndarray | None = None  # (S, R) backward's first all-gather issue after its start (CPU)
    gathers_block: bool = False  # the all-gathers block compute from issue to end (spans.gathers_block)


def recorded_setting(trace: Trace, impl: str) -> tuple[Setting, str]:
    """The recorded prefetch / separate_reduce_scatter from ddp.meta, else the strategy's defaults."""
    found = run_meta(trace).get(SHARDING_KEY)
    sharding: dict = found if isinstance(found, dict) else {}
    prefetch, separate = sharding.get("prefetch"), sharding.get("separate_reduce_scatter")
    if isinstance(prefetch, int) and not isinstance(prefetch, bool) and prefetch >= 1:
        return Setting(prefetch, bool(separate)), "ddp.meta"
    default = DEFAULT_PREFETCH[impl]
    why = "fsdp's default" if impl == "fsdp" else "FSDP2's default of one unit ahead"
    return Setting(default, bool(separate)), f"inferred: not in ddp.meta, {why}"


def _served(calls: pd.DataFrame, world: int, lanes: int, separate: bool) -> pd.DataFrame:
    """Every paired call's service time (comm_cost.transfer_times), reduce-scatters on a communicator of
    their own when `separate`; start and end as `start`, `end`."""
    channel = np.where((calls["op"] == REDUCE_SCATTER) & separate, 1, 0)
    f = calls.assign(channel=channel).sort_values(["rank", "channel", "start_ns"], kind="stable")
    served = transfer_times(f, world, lanes, "channel").drop(columns="wait_ns")
    return served.rename(columns={"start_ns": "start", "end_ns": "end"})


def _with_layout_bytes(calls: pd.DataFrame, trace: Trace) -> pd.DataFrame:
    """Calls whose range carried no byte count (torch.profiler traces) take their unit's bytes from
    ddp.meta's `sharded` layout (all_gather_bytes / reduce_scatter_bytes)."""
    entries = run_meta(trace).get("sharded")
    layout: list = entries if isinstance(entries, list) else []
    known = {
        (op, str(e["name"])): float(e[f"{op}_bytes"])
        for e in layout
        if isinstance(e, dict) and "name" in e
        for op in (ALL_GATHER, REDUCE_SCATTER)
        if isinstance(e.get(f"{op}_bytes"), (int, float))
    }
    if not known or calls["bytes"].notna().all():
        return calls
    found = [known.get((op, str(tag)), np.nan) for op, tag in zip(calls["op"], calls["tag"], strict=True)]
    return calls.assign(bytes=calls["bytes"].fillna(pd.Series(found, index=calls.index)))


def _order(trace: Trace, gathers: pd.DataFrame) -> list[str]:
    """Units in forward order: the forward all-gathers of the first step on the lowest rank, by issue."""
    fwd = gathers[gathers["phase"] == "forward"]
    first = fwd[(fwd["step"] == fwd["step"].min()) & (fwd["rank"] == fwd["rank"].min())]
    return list(dict.fromkeys(first.sort_values("issue_ns")["tag"].astype(str)))


def recorded_shard(loaded: LoadedRun, impl: str) -> ShardRecorded:
    """The replay's inputs (module docstring) from a loaded sharded run."""
    trace, patterns, works = loaded.trace, loaded.patterns, loaded.works
    setting, source = recorded_setting(trace, impl)
    found = loaded.calls
    gpu = found.source == KERNELS
    calls = _with_layout_bytes(found.frame[found.frame["step"] >= 0].reset_index(drop=True), trace)
    gathers = calls[calls["op"] == ALL_GATHER]
    if gathers.empty:
        raise TraceError(f"{trace.path}: {impl}: no all-gather calls inside steps: nothing to model")
    lanes = 1 if gpu or run_meta(trace).get("backend") == "nccl" else GLOO_LANES
    world = world_size(trace.meta, len(trace.ranks))
    served = _served(calls, world, lanes, setting.separate)
    units = _order(trace, gathers)
    spans = unit_spans(trace, calls, units, gpu, setting.prefetch)
    fwd = phase_windows(trace, patterns, works, "forward")
    if gpu:
        bwd = backward_windows(works).rename(columns={"start": "lo", "end": "hi"})
    else:
        bwd = phase_windows(trace, patterns, works, "backward")
    last = calls.groupby(["rank", "step"], as_index=False)["end_ns"].max()
    per_step = measure_trace(trace, patterns, works)[0][["rank", "step", "step_ms"]]
    base = per_step.merge(fwd, on=["rank", "step"]).merge(bwd, on=["rank", "step"], suffixes=("_f", "_b"))
    base = base.merge(last, on=["rank", "step"])
    back_gathers = gathers[gathers["phase"] == "backward"]
    first_issue = back_gathers.groupby(["rank", "step"], as_index=False)["issue_ns"].min()
    base = base.merge(first_issue, on=["rank", "step"], how="left")
    # backward gathers every unit (fsdp) or every unit but the root (FSDP2): those of the first rank-step
    first = spans[spans["phase"] == "backward"]
    first = first[(first["rank"] == first["rank"].min()) & (first["step"] == first["step"].min())]
    back_units = np.sort(first["unit"].to_numpy())[::-1]
    counts = spans.groupby(["rank", "step"]).size().rename("n").reset_index()
    base = base.merge(counts, on=["rank", "step"])
    base = base[base["n"] == len(units) + len(back_units)]
    ranks = sorted(base["rank"].unique())
    base = every_rank(base, len(ranks))
    if base.empty or len(ranks) < world:
        raise TraceError(
            f"{trace.path}: {impl}: no step where every rank ({world}) gathers all {len(units)} units in forward and "
            "backward: give every rank's file (--merge) or a complete recording"
        )
    steps = base["step"].unique()
    S, R, U = len(steps), len(ranks), len(units)
    grid = lambda col: base[col].to_numpy(float).reshape(S, R)
    f0, f1, b0, b1 = grid("lo_f"), grid("hi_f"), grid("lo_b"), grid("hi_b")
    if gpu:  # the phases meet at backward's first kernel: the gap is forward's last unit's compute
        f1 = b0.copy()
    spans = spans.merge(base[["rank", "step"]], on=["rank", "step"]).sort_values(["step", "rank", "phase", "k"])
    by_phase, waits = {}, {}
    for phase, lo, hi, order in (("forward", f0, f1, np.arange(U)), ("backward", b0, b1, back_units)):
        shape = Shape(trace, served, ranks, S, len(order))
        by_phase[phase], waits[phase] = _phase_spans(shape, spans[spans["phase"] == phase], lo, hi, order, U)
    tail = np.maximum(grid("end_ns") - b1, 0.0)
    # CPU: the host's issue is on the phase's clock (GPU: a host time against kernel times, taken as the start)
    issued = np.clip(np.nan_to_num(grid("issue_ns") - b0), 0.0, by_phase["backward"]["lead"])
    offset = f0 - f0.min(axis=1, keepdims=True)  # the ranks' skew at the step's start
    step_ns = grid("step_ms") * NS_PER_MS
    other = step_ns - (b1 - f0) - tail
    exposed = (waits["forward"].sum(axis=2) + waits["backward"].sum(axis=2) + tail).mean() / NS_PER_MS
    sizes = calls.groupby(["op", "tag"])["bytes"].median()
    size = lambda op: np.array([float(sizes.get((op, u), 0.0)) for u in units])
    return ShardRecorded(
        implementation=impl,
        setting=setting,
        setting_source=source,
        gpu=gpu,
        lanes=lanes,
        units=units,
        backward_units=back_units,
        steps=steps,
        step_ns=step_ns,
        other=other,
        gap=np.maximum(b0 - f1, 0.0),
        offset=offset,
        spans=by_phase,
        recorded_wait=waits,
        gather_bytes=size(ALL_GATHER),
        scatter_bytes=size(REDUCE_SCATTER),
        reduce_bytes=_reduces(calls, spans, units),
        served=served[served["step"].isin(steps)].reset_index(drop=True),
        exposed_ms=float(exposed),
        scatter_as_all_reduce=impl == "fsdp" and lanes == GLOO_LANES,
        backward_issue=None if gpu else issued,  # None: at the phase's start
        gathers_block=not gpu and gathers_block(trace),
    )


@dataclass(frozen=True)
class Shape:
    """What turning one phase's span rows into (S, R, U) arrays needs."""

    trace: Trace
    served: pd.DataFrame
    ranks: list
    steps: int
    units: int

    def rank_column(self, per_unit: bool) -> pd.Series:
        """The rank of each element of a raveled (S, R, U) array (per_unit) or (S, R) one."""
        ranks = np.repeat(self.ranks, self.units) if per_unit else np.asarray(self.ranks)
        return pd.Series(np.tile(ranks, self.steps))

    def blocked(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return blocked_inside(self.trace, self.rank_column(True), a.ravel(), b.ravel()).reshape(a.shape)

    def beside(self, a: np.ndarray, b: np.ndarray, per_unit: bool = True) -> np.ndarray:
        return comm_beside(self.served, self.rank_column(per_unit), a.ravel(), b.ravel()).reshape(a.shape)


def _phase_spans(
    shape: Shape, mine: pd.DataFrame, lo: np.ndarray, hi: np.ndarray, order: np.ndarray, units: int
) -> tuple[dict, np.ndarray]:
    """One phase's lead / own / glue (and the communication beside them) and its recorded waits (in
    forward unit order, of all `units`), from its span rows sorted by step, rank and position; `order`:
    the units the phase gathers, in its order."""
    S, R, U = shape.steps, len(shape.ranks), shape.units

    def arr(col: str) -> np.ndarray:
        return mine[col].to_numpy(float).reshape(S, R, U).copy()

    need, resume, post, nxt = arr("need"), arr("resume"), arr("post"), arr("next_need")
    nxt[:, :, -1] = np.maximum(hi, resume[:, :, -1])
    post = np.where(np.isnan(post), nxt, post)
    own = np.maximum(post - resume - shape.blocked(resume, post), 0.0)
    glue = np.maximum(nxt - post - shape.blocked(post, nxt), 0.0)
    typical = lambda a, d: shape.beside(a, a + np.nanmedian(d, axis=(0, 1))[None, None, :])
    spans = {
        "lead": np.maximum(need[:, :, 0] - lo, 0.0), "own": own, "glue": glue,
        "lead_beside": shape.beside(lo, need[:, :, 0], per_unit=False),
        "own_beside": shape.beside(resume, post), "glue_beside": shape.beside(post, nxt),
        "own_typical": typical(resume, own), "glue_typical": typical(post, glue),
    }  # fmt: skip
    waits = np.zeros((S, R, units))
    waits[:, :, order] = resume - need
    return spans, np.maximum(waits, 0.0)


def _reduces(calls: pd.DataFrame, spans: pd.DataFrame, units: list[str]) -> list[list[float]]:
    """Per unit: the bytes of the replicated all-reduces issued in its backward span (resume to the next
    need) on the first recorded rank-step; issued before every unit's span: the first backward unit's."""
    ar = calls[(calls["op"] == ALL_REDUCE) & calls["bytes"].notna()]
    out: list[list[float]] = [[] for _ in units]
    bwd = spans[spans["phase"] == "backward"]
    if ar.empty or bwd.empty:
        return out
    rank, step = bwd["rank"].iloc[0], bwd["step"].iloc[0]
    mine = bwd[(bwd["rank"] == rank) & (bwd["step"] == step)].sort_values("k")
    own = ar[(ar["rank"] == rank) & (ar["step"] == step)]
    at = np.searchsorted(mine["resume"].to_numpy(float), own["issue_ns"].to_numpy(float), side="right") - 1
    for k, nbytes in zip(np.maximum(at, 0), own["bytes"].to_numpy(float), strict=True):  # a handful per step
        out[int(mine["unit"].iloc[k])].append(float(nbytes))
    return out
