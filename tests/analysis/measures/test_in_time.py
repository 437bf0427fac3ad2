"""Did the all-gathers come in time (measures/in_time.py)."""

import numpy as np
import pandas as pd

from analysis import analyze_collectives
from analysis.measures import intervals as iv
from analysis.measures.in_time import in_time_sentence, waited_ns
from tests.analysis.measures.test_op_phase import write_fsdp_shaped


def brute_waited(start, end, busy: set) -> int:
    """Walk back from the instant before end while nothing computes, not past start."""
    t = end - 1
    while t >= start and t not in busy:
        t -= 1
    return end - 1 - t


def test_waited_matches_a_walk_back_over_points():
    rng = np.random.default_rng(5)
    s = rng.integers(0, 3000, 200)
    compute = iv.union(s, s + rng.integers(1, 50, 200))
    busy = {t for a, b in zip(*compute, strict=True) for t in range(a, b)}
    start = rng.integers(0, 3000, 500)
    end = start + rng.integers(0, 80, 500)
    got = waited_ns(start, end, compute)
    assert got.tolist() == [brute_waited(a, b, busy) for a, b in zip(start, end, strict=True)]
    assert waited_ns(start, end, (iv.EMPTY, iv.EMPTY)).tolist() == (end - start).tolist()


def test_sentence_counts_layers_late_on_average_and_names_the_worst():
    # 2 ranks x 2 steps; per rank-step: wq waits 1.2 ms, wk 0.4 ms on rank 0 only, wv never
    rows = []
    for rank in (0, 1):
        for step in (0, 1):
            rows += [
                (rank, step, "layers.0.wq", 1.2),
                (rank, step, "layers.0.wk", 0.8 if rank == 0 else 0.0),
                (rank, step, "layers.0.wv", 0.0),
                (rank, step, "", 0.000001),  # the root: 1 ns, under the 10 µs tolerance
            ]
    calls = pd.DataFrame(rows, columns=["rank", "step", "tag", "waited_ms"])
    assert in_time_sentence(calls, "forward") == (
        "all-gathers in time for 2 of 4 layers in forward; the late ones cost 1.6 ms/step; worst: layers.0.wq (1.2 ms)"
    )
    calls["waited_ms"] = 0.0
    assert in_time_sentence(calls, "backward") == "all-gathers in time for 4 of 4 layers in backward"


def test_collectives_view_gives_each_call_its_wait_and_the_trace_its_answer(tmp_path):
    path = write_fsdp_shaped(tmp_path / "fsdp.sqlite", scale=1000)  # times in µs
    view = analyze_collectives(path)
    calls = view.calls[view.calls["op"] == "all_gather"].set_index("tag")
    # layers.0 [10, 110) µs: compute stopped at 10; layers.1 [300, 350): compute ran until 300
    assert calls.loc["layers.0", "waited_ms"] == 0.1 and calls.loc["layers.1", "waited_ms"] == 0.05
    # reduce-scatter layers.0 [1000, 1450): backward compute until 1400, then grad_sync
    rs = view.calls[view.calls["op"] == "reduce_scatter"].set_index("tag")
    assert rs.loc["layers.1", "waited_ms"] == 0 and rs.loc["layers.0", "waited_ms"] == 0.05
    (facts,) = view.to_json()["traces"]
    assert facts["in_time"] == [
        "all-gathers in time for 0 of 2 layers in forward; the late ones cost 0.15 ms/step; worst: layers.0 (0.1 ms)"
    ]
