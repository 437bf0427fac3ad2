"""Steps and phases from PyTorch's own markers where a trace has none of ours (trace/phase_markers.py)."""

import numpy as np
import pandas as pd

from analysis.trace.frames import NVTX_KIND_NAMES, NVTX_PUSH_POP
from analysis.trace.patterns import Patterns
from analysis.trace.phase_markers import NONE_FOUND, OURS, derive_phases


def nvtx(rows, part=0):
    """An nvtx frame from (pid, tid, start, end, text) rows, push/pop ranges."""
    pid, tid, start, end, text = (list(c) for c in zip(*rows, strict=True))
    n = len(rows)
    return pd.DataFrame(
        {
            "part": np.full(n, part, np.int64),
            "pid": np.array(pid, np.int64),
            "tid": np.array(tid, np.int64),
            "end_tid": np.array(tid, np.int64),
            "start": np.array(start, np.int64),
            "end": np.array(end, np.int64),
            "text": np.array(text, dtype=object),
            "kind": pd.Categorical.from_codes(np.full(n, NVTX_PUSH_POP, np.int8), categories=NVTX_KIND_NAMES),
            "domain": pd.Categorical([""] * n),
            "payload": np.full(n, -1, np.int64),
        }
    ).sort_values(["part", "pid", "start"], ignore_index=True)


def added(before, after):
    """The rows derive_phases added, as (text, tid, start, end) sorted by start then text."""
    keys = ["pid", "tid", "start", "end", "text"]
    merged = after[keys].merge(before[keys], how="left", indicator=True)
    new = merged[merged["_merge"] == "left_only"]
    return sorted(zip(new["text"], new["tid"], new["start"], new["end"], strict=True), key=lambda r: (r[2], r[0]))


def ddp_step(t0, autograd_tid=1, suffix=", seq = 7, op_id = 3"):
    """One iteration of plain DDP as emit_nvtx / autograd-nvtx marks it, from t0 (ns): forward [t0+1,
    t0+20), two autograd ops [t0+30, t0+40) and [t0+45, t0+60) on the autograd thread, the optimizer
    [t0+70, t0+80), each inside ProfilerStep-free time."""
    return [
        (9, 1, t0 + 1, t0 + 20, "DistributedDataParallel.forward"),
        (9, 1, t0 + 2, t0 + 3, "aten::linear" + suffix),
        (9, autograd_tid, t0 + 30, t0 + 40, "autograd::engine::evaluate_function: MmBackward0" + suffix),
        (9, autograd_tid, t0 + 45, t0 + 60, "autograd::engine::evaluate_function: AddBackward0" + suffix),
        (9, 1, t0 + 70, t0 + 80, "Optimizer.step#SGD.step"),
    ]


def test_our_own_ranges_are_kept_as_they_are():
    frame = nvtx([(9, 1, 0, 100, "step 0"), (9, 1, 0, 30, "forward"), (9, 1, 30, 60, "backward")])
    frame = pd.concat([frame, nvtx([(9, 1, 60, 90, "optimizer")])], ignore_index=True)
    out, said = derive_phases(frame, Patterns())
    assert said == OURS
    assert out.equals(frame)


def test_profiler_steps_ddp_forward_autograd_ops_and_the_optimizer_make_the_phases():
    rows = [(9, 1, 0, 100, "ProfilerStep#4"), (9, 1, 100, 200, "ProfilerStep#5"), *ddp_step(0), *ddp_step(100, 2)]
    before = nvtx(rows)
    out, said = derive_phases(before, Patterns())
    assert said == (
        "steps from ProfilerStep#N, forward from DistributedDataParallel.forward, backward from "
        "autograd::engine::evaluate_function ops, optimizer from Optimizer.step#SGD.step"
    )
    assert added(before, out) == [
        ("forward", 1, 1, 20),
        ("backward", 1, 30, 60),  # one range per step over the autograd ops, on their thread
        ("optimizer", 1, 70, 80),
        ("forward", 1, 101, 120),
        ("backward", 2, 130, 160),
        ("optimizer", 1, 170, 180),
    ]
    assert list(out["kind"].cat.codes.unique()) == [NVTX_PUSH_POP]
    assert (np.diff(out["start"].to_numpy()) >= 0).all()  # still sorted by (part, pid, start)


def test_without_step_markers_steps_run_from_one_forward_start_to_the_next():
    before = nvtx(ddp_step(0) + ddp_step(100) + ddp_step(250))
    out, said = derive_phases(before, Patterns())
    assert said.startswith("steps from the starts of DistributedDataParallel.forward, forward from")
    steps = [r for r in added(before, out) if r[0].startswith("step ")]
    assert steps == [("step 0", 1, 1, 101), ("step 1", 1, 101, 251), ("step 2", 1, 251, 330)]  # last: last range end
    backward = [r[2:] for r in added(before, out) if r[0] == "backward"]
    assert backward == [(30, 60), (130, 160), (280, 310)]


def test_the_autograd_ops_a_reader_keeps_apart_are_used_and_markers_before_the_first_step_left_out():
    before = nvtx([(9, 1, 100, 200, "ProfilerStep#1"), (9, 1, 200, 300, "ProfilerStep#2")])
    ops = pd.DataFrame(
        {"part": 0, "pid": 9, "tid": [3, 3, 3, 3], "start": [50, 120, 150, 210], "end": [60, 140, 190, 250]}
    )
    out, said = derive_phases(before, Patterns(), autograd=ops)
    assert said == (
        "steps from ProfilerStep#N, no forward found, backward from autograd::engine::evaluate_function ops, "
        "no optimizer found"
    )
    assert added(before, out) == [("backward", 3, 120, 190), ("backward", 3, 210, 250)]


def test_fsdp2_markers_begin_steps_and_give_backward_where_no_autograd_op_is_recorded():
    rows = []
    for t0 in (0, 1000):
        rows += [
            (9, 1, t0 + 1, t0 + 5, "FSDP::root_pre_forward"),
            (9, 1, t0 + 6, t0 + 9, "FSDP::pre_forward (layers.0)"),
            (9, 1, t0 + 10, t0 + 12, "FSDP::post_forward (layers.0)"),
            (9, 4, t0 + 300, t0 + 320, "FSDP::pre_backward (layers.0)"),
            (9, 4, t0 + 400, t0 + 450, "FSDP::post_backward_reduce (layers.0)"),
        ]
    before = nvtx(rows)
    out, said = derive_phases(before, Patterns())
    assert said == (
        "steps from the starts of FSDP::root_pre_forward, no forward found, "
        "backward from FSDP::pre_backward/post_backward ranges, no optimizer found"
    )
    got = added(before, out)
    assert [r for r in got if r[0] == "backward"] == [("backward", 4, 300, 450), ("backward", 4, 1300, 1450)]
    assert [r[2:] for r in got if r[0].startswith("step")] == [(1, 1001), (1001, 1450)]


def test_nothing_to_go_by_says_none_found_and_changes_nothing():
    before = nvtx([(9, 1, 0, 10, "aten::mm, seq = 1"), (9, 1, 20, 30, "my own range")])
    out, said = derive_phases(before, Patterns())
    assert said == NONE_FOUND
    assert out.equals(before)


def test_processes_that_disagree_are_named():
    mine = nvtx([(9, 1, 0, 100, "step 0"), (9, 1, 0, 30, "forward"), (9, 1, 30, 60, "backward")])
    mine = pd.concat([mine, nvtx([(9, 1, 60, 90, "optimizer")]), nvtx([(12, 1, 0, 10, "aten::mm")])])
    _, said = derive_phases(mine.sort_values(["pid", "start"], ignore_index=True), Patterns())
    assert said == f"pid 9: {OURS}; pid 12: {NONE_FOUND}"


def test_a_users_own_step_pattern_is_named_by_its_ranges():
    before = nvtx([(9, 1, 0, 100, "train_step 0"), (9, 1, 100, 200, "train_step 1")])
    _, said = derive_phases(before, Patterns())
    assert said.startswith("steps from 'train_step 0' ranges, no forward found")


def test_fsdp1_forward_ranges_nest_and_the_outermost_is_the_models():
    rows = []
    for t0 in (0, 100):
        rows += [
            (9, 1, t0 + 1, t0 + 40, "FullyShardedDataParallel.forward"),
            (9, 1, t0 + 5, t0 + 15, "FullyShardedDataParallel.forward"),  # a wrapped layer inside the model
            (9, 1, t0 + 20, t0 + 30, "FullyShardedDataParallel.forward"),
        ]
    before = nvtx(rows)
    out, said = derive_phases(before, Patterns())
    assert said.startswith("steps from the starts of FullyShardedDataParallel.forward, forward from Fully")
    got = added(before, out)
    assert [r[2:] for r in got if r[0] == "forward"] == [(1, 40), (101, 140)]
    assert [r[2:] for r in got if r[0].startswith("step")] == [(1, 101), (101, 140)]
