"""Where a trace's steps and phases come from: this project's NVTX ranges, else PyTorch's own markers.

`derive_phases(nvtx, patterns, autograd)` returns the nvtx frame with a range added for each step and
phase the trace marks only in PyTorch's way, named as this project's contract names them (`step N`,
`forward`, `backward`, `optimizer`: what the default patterns match), and one sentence saying where each
came from (kept in info[0] under PHASES_KEY; every output prints it). Per process, in priority order:

steps     1. ranges the step pattern matches: ours (`step N`), torch.profiler's `ProfilerStep#N`, or the
             user's own (`train_step 3`, `--step-pattern`);
          2. the starts of the forward passes (the forward found below: ours, `DistributedDataParallel.
             forward`, FSDP2's `FSDP::root_pre_forward`): step k runs from forward k's start to forward
             k+1's, the last to the end of the last range of the process after its start;
          3. none: the whole capture is one window.
forward   ours (forward pattern); else the outermost of DDP's `DistributedDataParallel.forward` or
          FSDP1's `FullyShardedDataParallel.forward` record_function ranges
          (FSDP2's forward hooks begin steps but make no forward range: see _forward_markers).
backward  ours (backward pattern); else per step the span of the autograd engine's ops
          (`autograd::engine::evaluate_function: ...`: torch.profiler's cpu_ops, or the NVTX ranges of
          `nsys --pytorch=autograd-nvtx` / `torch.autograd.profiler.emit_nvtx`, which end in
          `, seq = N, ...`); else the GPU launches of the autograd engine's thread (nsys exports name
          it `pt_autograd_<device>`): per step their span, without steps each run of them that no
          other thread interrupts; else per step the span of FSDP2's `FSDP::pre_backward/post_backward_*`.
optimizer ours (optimizer pattern); else torch.optim's `Optimizer.step#<Class>.step` ranges.
A phase spans its markers per step: [start of the first, end of the last that starts in the step,
i.e. in [step start, next step's start)]; markers before the first step are left out.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from analysis.trace.frames import NVTX_KIND_NAMES, NVTX_MARK, NVTX_PUSH_POP, Trace
from analysis.trace.patterns import Patterns, matches
from contract.names import BACKWARD, FORWARD, OPTIMIZER, STEP_PREFIX

PHASES_KEY = "phases"  # in info[0]: where the steps and phases came from (phases_sentence)
OURS = "our NVTX ranges"
NONE_FOUND = "none found (no step or phase markers: the whole capture is one window)"

AUTOGRAD_OP = re.compile(r"^autograd::engine::evaluate_function: ")
PROFILER_STEP = re.compile(r"^ProfilerStep#\d+")
# the wrapper's forward: DDP's, and FSDP1's (nested, one per wrapped module: the outermost is the model's)
DDP_FORWARD = re.compile(r"^(?:DistributedDataParallel|FullyShardedDataParallel)\.forward(?:,|$)")
OPTIMIZER_STEP = re.compile(r"^Optimizer\.step#\w+\.step(?:,|$)")
# FSDP2's record_function ranges (torch/distributed/fsdp/_fully_shard/*.py), most suffixed " (<module>)"
FSDP_ROOT_FORWARD = re.compile(r"^FSDP::root_pre_forward\b")
FSDP_FORWARD = re.compile(r"^FSDP::(root_pre_forward|pre_forward|post_forward|forward_prefetch)\b")
FSDP_BACKWARD = re.compile(r"^FSDP::(pre_backward|post_backward_\w+|backward_prefetch)\b")
FSDP_AFTER_BACKWARD = re.compile(r"^FSDP::root_post_backward_callback\b")

RANGE_COLUMNS = ["part", "pid", "tid", "start", "end"]


def phases_of(trace: Trace) -> str:
    """Where a loaded trace's steps and phases came from, as its reader found them."""
    return str(trace.info.get(0, {}).get(PHASES_KEY, NONE_FOUND))


def derive_phases(
    nvtx: pd.DataFrame,
    patterns: Patterns,
    autograd: pd.DataFrame | None = None,
    launches: pd.DataFrame | None = None,
) -> tuple[pd.DataFrame, str]:
    """(nvtx with the derived ranges added, the phases sentence); `autograd`: the autograd engine's
    ops (RANGE_COLUMNS) where the reader keeps them out of nvtx (torch.profiler's cpu_ops), else they
    are looked for among the nvtx ranges; `launches`: every GPU launch (part, pid, tid, t, autograd:
    whether its thread is the autograd engine's), where the reader knows the threads' names."""
    ranges = nvtx[nvtx["kind"].cat.codes.to_numpy() != NVTX_MARK]
    texts = ranges["text"].astype("category")
    named = lambda regex: ranges[matches(texts, regex)]
    ops = named(AUTOGRAD_OP)[RANGE_COLUMNS] if autograd is None else autograd[RANGE_COLUMNS]
    found = {
        "step": named(patterns.regex("step")),
        "forward": named(patterns.regex("forward")),
        "backward": named(patterns.regex("backward")),
        "optimizer": named(patterns.regex("optimizer")),
        "ddp_forward": named(DDP_FORWARD),
        "fsdp_root": named(FSDP_ROOT_FORWARD),
        "fsdp_backward": named(FSDP_BACKWARD),
        "optimizer_step": named(OPTIMIZER_STEP),
        "autograd": ops,
        "autograd_thread": autograd_thread_runs(launches),
    }
    added: list[pd.DataFrame] = []
    said: dict[str, list[tuple[int, int]]] = {}
    spans = [ranges[["part", "pid", "end"]]]
    if launches is not None:
        spans.append(launches[["part", "pid"]].assign(end=launches["t"]))
    last_end = pd.concat(spans).groupby(["part", "pid"], sort=True)["end"].max()
    for (part, pid), end in last_end.items():  # one pass per process
        mine = {k: v[(v["part"].to_numpy() == part) & (v["pid"].to_numpy() == pid)] for k, v in found.items()}
        new, sources = _process_phases(mine, int(end))
        added += new
        said.setdefault(sentence(sources), []).append((int(part), int(pid)))
    return _with_ranges(nvtx, added), _joined(said)


def _process_phases(mine: dict[str, pd.DataFrame], last_end: int) -> tuple[list[pd.DataFrame], dict[str, str]]:
    """The derived ranges of one process and where each phase came from ('' for none)."""
    new: list[pd.DataFrame] = []
    sources: dict[str, str] = {}
    forward, sources["forward"], derived_forward = _forward_markers(mine)
    steps = mine["step"]
    if len(steps):
        sources["step"] = _named_source(steps, "step")
        starts = np.sort(steps["start"].to_numpy(np.int64))
    elif len(forward):
        starts = np.sort(forward["start"].to_numpy(np.int64))
        sources["step"] = f"the starts of {sources['forward'] or 'FSDP::root_pre_forward'}"
        new.append(_step_ranges(forward, starts, last_end))
    else:
        sources["step"], starts = "", np.zeros(0, np.int64)
    if derived_forward is not None:
        new.append(derived_forward)
    if len(mine["backward"]):
        sources["backward"] = _named_source(mine["backward"], "backward")
    elif len(mine["autograd"]):
        sources["backward"] = "autograd::engine::evaluate_function ops"
        new.append(_spans(mine["autograd"], starts, BACKWARD))
    elif len(mine["autograd_thread"]):
        sources["backward"] = "the launches of the autograd engine's thread (pt_autograd_N)"
        runs = mine["autograd_thread"]
        new.append(_spans(runs, starts, BACKWARD) if starts.size else runs.assign(text=BACKWARD))
    elif len(mine["fsdp_backward"]):
        sources["backward"] = "FSDP::pre_backward/post_backward ranges"
        new.append(_spans(mine["fsdp_backward"], starts, BACKWARD))
    else:
        sources["backward"] = ""
    if len(mine["optimizer"]):
        sources["optimizer"] = _named_source(mine["optimizer"], "optimizer")
    elif len(mine["optimizer_step"]):
        sources["optimizer"] = str(mine["optimizer_step"]["text"].iloc[0]).split(",")[0]
        new.append(mine["optimizer_step"][RANGE_COLUMNS].assign(text=OPTIMIZER))
    else:
        sources["optimizer"] = ""
    return [frame for frame in new if len(frame)], sources


def _forward_markers(mine: dict[str, pd.DataFrame]) -> tuple[pd.DataFrame, str, pd.DataFrame | None]:
    """(the ranges whose starts begin steps, where forward came from ('' for nowhere), the derived
    forward ranges or None). FSDP2's markers begin steps but make no forward range: its forward hooks
    hold the waits for the all-gathers, which on a CPU-only trace would count as forward compute (the
    collectives view still labels calls in them forward, measure/comm_breakdown.py)."""
    if len(mine["forward"]):
        return mine["forward"], _named_source(mine["forward"], "forward"), None
    if len(mine["ddp_forward"]):
        ddp = _outermost(mine["ddp_forward"])
        name = str(ddp["text"].iloc[0]).split(",")[0]
        return ddp, name, ddp[RANGE_COLUMNS].assign(text=FORWARD)
    return mine["fsdp_root"], "", None


def _outermost(ranges: pd.DataFrame) -> pd.DataFrame:
    """The ranges (of one process) that lie inside no other of them."""
    ordered = ranges.sort_values(["start", "end"], ascending=[True, False], kind="stable")
    end = ordered["end"].to_numpy(np.int64)
    before = np.r_[np.iinfo(np.int64).min, np.maximum.accumulate(end)[:-1]]
    return ordered[end > before]


def _named_source(ranges: pd.DataFrame, phase: str) -> str:
    """How ranges the patterns matched are named: ours, ProfilerStep#N, or the user's first name."""
    text = str(ranges["text"].iloc[0])
    ours = {"step": text.startswith(STEP_PREFIX), "forward": text == FORWARD, "backward": text == BACKWARD}
    if ours.get(phase, text == OPTIMIZER):
        return OURS
    if phase == "step" and PROFILER_STEP.search(text):
        return "ProfilerStep#N"
    return f"'{text}' ranges"


def _step_ranges(forward: pd.DataFrame, starts: np.ndarray, last_end: int) -> pd.DataFrame:
    """`step k` from the k-th forward start to the next one; the last to the process's last range end."""
    first = forward.sort_values("start", kind="stable").iloc[0]
    ends = np.r_[starts[1:], max(last_end, int(starts[-1]) + 1)]
    return pd.DataFrame(
        {
            "part": first["part"],
            "pid": first["pid"],
            "tid": first["tid"],
            "start": starts,
            "end": ends,
            "text": [f"{STEP_PREFIX}{k}" for k in range(starts.size)],
        }
    )


def _spans(markers: pd.DataFrame, starts: np.ndarray, text: str) -> pd.DataFrame:
    """Per step (markers starting in [start_k, start_k+1); all markers when there are no steps): one
    range from the first marker's start to the last end, on the thread that opened most of them."""
    t = markers["start"].to_numpy(np.int64)
    step = np.searchsorted(starts, t, side="right") - 1 if starts.size else np.zeros(t.size, np.int64)
    keep = markers.assign(step=step)[step >= 0]
    if len(keep) == 0:
        return pd.DataFrame(columns=[*RANGE_COLUMNS, "text"])
    grouped = keep.groupby("step", sort=True)
    out = grouped.agg(
        part=("part", "first"),
        pid=("pid", "first"),
        tid=("tid", lambda tids: tids.mode().iloc[0]),
        start=("start", "min"),
        end=("end", "max"),
    )
    return out.reset_index(drop=True)[RANGE_COLUMNS].assign(text=text)


def autograd_thread_runs(launches: pd.DataFrame | None) -> pd.DataFrame:
    """One range (RANGE_COLUMNS) per run of GPU launches from an autograd engine thread that no other
    thread of the process launches in between: from the run's first launch to just after its last.
    PyTorch's engine runs a CUDA backward on its own device thread (`pt_autograd_<device>`) while the
    calling thread waits in `backward()`, so each run is one backward pass's launches."""
    if launches is None or not launches["autograd"].any():
        return pd.DataFrame(columns=RANGE_COLUMNS)
    ordered = launches.sort_values(["part", "pid", "t"], kind="stable")
    is_ag = ordered["autograd"].to_numpy(bool)
    key = ordered["part"].to_numpy(np.int64) * (1 << 32) + ordered["pid"].to_numpy(np.int64)
    boundary = np.r_[True, (is_ag[1:] != is_ag[:-1]) | (key[1:] != key[:-1])]
    runs = ordered.assign(run=np.cumsum(boundary))[is_ag]
    out = runs.groupby("run", sort=True).agg(
        part=("part", "first"), pid=("pid", "first"), tid=("tid", "first"), start=("t", "min"), end=("t", "max")
    )
    return out.assign(end=out["end"] + 1).reset_index(drop=True)[RANGE_COLUMNS]


def sentence(sources: dict[str, str]) -> str:
    """One process's sources as words: `our NVTX ranges`, `none found ...`, or each phase's source."""
    if all(s == OURS for s in sources.values()):
        return OURS
    if not any(sources.values()):
        return NONE_FOUND
    order = ["step", "forward", "backward", "optimizer"]
    named = {"step": "steps"}
    return ", ".join(
        f"{named.get(p, p)} from {sources[p]}" if sources[p] else f"no {named.get(p, p)} found" for p in order
    )


def _joined(said: dict[str, list[tuple[int, int]]]) -> str:
    """One sentence for the trace: the processes' sentence when they agree, else each with its pids."""
    if not said:
        return NONE_FOUND
    if len(said) == 1:
        return next(iter(said))
    return "; ".join(f"pid {', '.join(str(p) for _, p in who)}: {words}" for words, who in said.items())


def _with_ranges(nvtx: pd.DataFrame, added: list[pd.DataFrame]) -> pd.DataFrame:
    """nvtx plus push/pop ranges (RANGE_COLUMNS + text) in the frame's dtypes, sorted by (part, pid, start)."""
    if not added:
        return nvtx
    new = pd.concat(added, ignore_index=True).astype(dict.fromkeys(RANGE_COLUMNS, np.int64))
    new = new.assign(
        end_tid=new["tid"],
        kind=pd.Categorical.from_codes(np.full(len(new), NVTX_PUSH_POP, np.int8), categories=NVTX_KIND_NAMES),
        domain="",
        payload=np.int64(-1),
    )[list(nvtx.columns)]
    domain = pd.Categorical(
        np.r_[nvtx["domain"].astype(str).to_numpy(dtype=object), new["domain"].to_numpy(dtype=object)]
    )
    out = pd.concat([nvtx.assign(domain=nvtx["domain"].astype(object)), new.assign(domain="")], ignore_index=True)
    out["domain"] = domain
    order = np.lexsort((out["start"].to_numpy(), out["pid"].to_numpy(), out["part"].to_numpy()))
    return out.take(order).reset_index(drop=True)
