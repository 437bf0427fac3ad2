"""Forward all-gathers of a foreign (FSDP2-shaped) trace: calls from PyTorch's gloo annotations, modules
and phases from FSDP2's markers, when each module's forward began (fsdp_units/gather_rows.py, torch_calls.py)."""

import numpy as np
import pytest

from analysis import analyze_collectives
from analysis.collectives import command as collectives
from tests.support.synthetic import START_END, NsysWriter

MS = 1_000_000


def write_fsdp2_shaped(path):
    """One CPU process (pid 700), no comm ranges of ours; times in ms:
    ProfilerStep#1 [0, 10); FSDP::pre_forward (layers.0) [1, 3) with gloo:all_gather [1.2, 2.9) on t701;
    FSDP::forward_prefetch for layers.1 [3, 3.1) holding FSDP::all_gather (layers.1) [3.01, 3.09), its
    gloo:all_gather [3.02, 5); FSDP::pre_forward (layers.1) [4, 5.1); backward [6, 9) holding
    FSDP::post_backward_reduce (layers.0) [7, 7.5) with gloo:all_reduce [7.1, 7.4) (the reduce-scatter)."""
    w = NsysWriter(path, flavour="2022", cupti=False, shuffle=True, seed=4)
    w.process(700, threads={700: "python3", 701: "gloo"})
    names = [
        "ProfilerStep#1",
        "FSDP::pre_forward (layers.0)",
        "FSDP::forward_prefetch for layers.1",
        "FSDP::all_gather (layers.1)",
        "FSDP::pre_forward (layers.1)",
        "backward",
        "FSDP::post_backward_reduce (layers.0)",
    ]
    starts = np.array([0, 1, 3, 3.01, 4, 6, 7]) * MS
    ends = np.array([10, 3, 3.1, 3.09, 5.1, 9, 7.5]) * MS
    w.nvtx(700, 700, starts.astype(np.int64), ends.astype(np.int64), np.array(names, dtype=object))
    w.nvtx(
        700,
        701,
        (np.array([1.2, 3.02, 7.1]) * MS).astype(np.int64),
        (np.array([2.9, 5, 7.4]) * MS).astype(np.int64),
        np.array(["gloo:all_gather", "gloo:all_gather", "gloo:all_reduce"], dtype=object),
        kind=START_END,
        end_tid=701,
    )
    return w.close()


def test_forward_gathers_their_modules_and_when_the_forward_began(tmp_path):
    view = analyze_collectives(write_fsdp2_shaped(tmp_path / "fsdp2.sqlite"))
    calls = view.calls.sort_values("issue_ns")
    assert list(calls["op"]) == ["all_gather", "all_gather", "reduce_scatter"]
    assert list(calls["tag"]) == ["layers.0", "layers.1", "layers.0"]
    rows = view.prefetch.sort_values("issue_ns")
    assert list(rows["tag"]) == ["layers.0", "layers.1"]
    assert list(rows["needed_ns"]) == [1 * MS, 4 * MS]  # layers.1 was prefetched before its forward began
    # nothing in this trace is compute before the backward: compute waited for each gather all along
    assert list(rows["waited_ns"]) == [int(1.7 * MS), int(1.98 * MS)]
    assert view.traces["in_time"].iloc[0] == [
        "waited (CPU): all-gathers in time for 0 of 2 layers in forward; the late ones cost 3.68 ms/step; "
        "worst: layers.1 (1.98 ms)"
    ]


def test_the_cli_writes_the_prefetch_chart_and_refuses_a_file_it_did_not_write(tmp_path, capsys):
    trace = write_fsdp2_shaped(tmp_path / "fsdp2.sqlite")
    page = tmp_path / "out" / "prefetch.html"
    assert collectives.main([str(trace), "--summary", "--prefetch-chart", str(page)]) == 0
    text = page.read_text()
    assert "forward all-gathers of step 1, rank 0" in text and "layers.1" in text
    assert len(list((tmp_path / "out").glob("plotly-*.min.js"))) == 1
    assert collectives.main([str(trace), "--summary", "--prefetch-chart", str(page)]) == 0  # ours: replaced
    mine = tmp_path / "mine.html"
    mine.write_text("<html>my notes</html>")
    assert collectives.main([str(trace), "--prefetch-chart", str(mine)]) == 2
    assert mine.read_text() == "<html>my notes</html>"
    assert "refusing to overwrite" in capsys.readouterr().err


def test_the_chart_draws_forward_ticks_where_the_trace_has_them_and_says_why_not_elsewhere(tmp_path):
    from analysis.fsdp_units.charts import prefetch_figure

    rows = analyze_collectives(write_fsdp2_shaped(tmp_path / "fsdp2.sqlite")).prefetch
    with_ticks = prefetch_figure(rows, 1, 0, "fsdp2")
    (ticks,) = [t for t in with_ticks.data if t.name == "module's forward began"]
    assert list(ticks.x) == pytest.approx([-0.2, 2.8])  # from the first issue (1.2 ms): 1 and 4 ms
    assert "No 'forward began' ticks" not in with_ticks.layout.xaxis.title.text
    unmarked = prefetch_figure(rows.assign(needed_ns=-1), 1, 0, "fsdp")  # our fsdp: no module forward ranges
    assert not [t for t in unmarked.data if t.name == "module's forward began"]
    assert "No 'forward began' ticks: this trace does not mark" in unmarked.layout.xaxis.title.text
