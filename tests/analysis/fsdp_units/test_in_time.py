"""Did the all-gathers come in time (fsdp_units/in_time.py)."""

import numpy as np
import pandas as pd

from analysis import analyze_collectives
from analysis.fsdp_units.gather_rows import WAITED
from analysis.fsdp_units.in_time import in_time_sentence, waited_ns
from analysis.measure import intervals as iv
from tests.analysis.measure.test_comm_breakdown import write_fsdp_shaped
from tests.support.synthetic import START_END, NsysWriter


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
    calls = pd.DataFrame(rows, columns=["rank", "step", "unit", "held_ms"]).assign(
        unit=lambda f: f["unit"].replace("", "(root)"), definition=WAITED, cause="late"
    )
    assert in_time_sentence(calls, "forward") == (
        "waited (CPU): all-gathers in time for 2 of 4 layers in forward; the late ones cost 1.6 ms/step; "
        "worst: layers.0.wq (1.2 ms)"
    )
    calls["held_ms"] = 0.0
    assert in_time_sentence(calls, "backward") == "waited (CPU): all-gathers in time for 4 of 4 layers in backward"


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
        "waited (CPU): all-gathers in time for 0 of 2 layers in forward; the late ones cost 0.15 ms/step; "
        "worst: layers.0 (0.1 ms)"
    ]


def write_waited_gather(path, marked: bool):
    """One CPU rank, step 0 [0, 1000) µs with forward [0, 600): an async comm:all_gather:layers.1 [100, 400)
    (issued on t500, ended on t501) that the rank blocks on from 250 (comm_wait:all_gather:layers.1 [250, 400)
    when `marked`), so compute is [0, 250) and [400, 600)."""
    w = NsysWriter(path, flavour="2022", cupti=False, seed=3)
    w.process(500, threads={500: "python3", 501: "gloo"})
    w.meta_mark(500, 500, 1, implementation="fsdp_fixture", rank=0, world_size=1)
    names = ["step 0", "forward", *(["comm_wait:all_gather:layers.1"] if marked else [])]
    w.nvtx(500, 500, 1000 * np.array([0, 0, 250][: len(names)]), 1000 * np.array([1000, 600, 400][: len(names)]),
           np.array(names, dtype=object))  # fmt: skip
    w.nvtx(500, 500, np.array([100_000]), np.array([400_000]), np.array(["comm:all_gather:layers.1"], dtype=object),
           kind=START_END, end_tid=501, payload=np.array([4096]))  # fmt: skip
    return w.close()


def test_a_marked_wait_for_an_async_gather_is_not_compute(tmp_path):
    marked = analyze_collectives(write_waited_gather(tmp_path / "marked.sqlite", marked=True))
    (waited,) = marked.calls.loc[marked.calls["op"] == "all_gather", "waited_ms"]
    assert waited == 0.15  # the rank stopped computing at 250 µs and the gather ended at 400 µs
    assert marked.to_json()["traces"][0]["in_time"][0].startswith(
        "waited (CPU): all-gathers in time for 0 of 1 layers in forward"
    )
    # without the mark, the time blocked inside forward reads as compute: the gather looks in time
    unmarked = analyze_collectives(write_waited_gather(tmp_path / "unmarked.sqlite", marked=False))
    assert unmarked.calls.loc[unmarked.calls["op"] == "all_gather", "waited_ms"].tolist() == [0.0]
