"""Held time and cause of each all-gather on GPU traces (gather_held.py, gather_cause.py), one synthetic
export per cause (tests/support/synthetic_gather.py; times in µs there, ms here)."""

import pytest

from analysis import analyze_collectives
from analysis.fsdp_units.gather_rows import HELD
from tests.support.synthetic_gather import Gather, write_gathers


def rows_of(path, unit="u"):
    view = analyze_collectives(path)
    g = view.gathers
    assert set(g["definition"]) == {HELD}
    return g[g["unit"] == unit].sort_values("rank").set_index("rank")


def both(*gathers):
    return (list(gathers), list(gathers))


def test_in_time_when_the_stream_is_still_busy_when_the_gather_ends(tmp_path):
    # gather [105, 130); unit launched at 160 after a kernel running until 200: ready 200, nothing held
    g = rows_of(write_gathers(tmp_path / "t.sqlite", both(Gather("u", 100, 105, 130, 150, 160, 50, 200))))
    assert g["held_ms"].tolist() == [0.0, 0.0] and g["cause"].tolist() == ["in time", "in time"]


def test_host_when_the_unit_is_launched_after_the_gather_ended_onto_an_idle_stream(tmp_path):
    # the stream idles from 100; the gather ends at 130, the unit is launched at 160: the GPU waited for the CPU
    g = rows_of(write_gathers(tmp_path / "h.sqlite", both(Gather("u", 100, 105, 130, 150, 160, 50, 100))))
    assert g["held_ms"].tolist() == [0.0, 0.0] and g["cause"].tolist() == ["host", "host"]


def test_issued_late_when_a_normal_transfer_starts_too_close_to_its_use(tmp_path):
    # issued at 140, runs [145, 195) at the run's bandwidth; unit launched at 160 onto a stream free since 100
    g = rows_of(write_gathers(tmp_path / "i.sqlite", both(Gather("u", 140, 145, 195, 150, 160, 50, 100))))
    assert g["held_ms"].tolist() == pytest.approx([0.035, 0.035])
    assert g["cause"].tolist() == ["issued late", "issued late"]
    assert g["moving_ms"].tolist() == pytest.approx([0.035, 0.035])
    assert g["hide_ms"].tolist() == pytest.approx([0.02, 0.02])  # issue 140 to ready 160


def test_queued_behind_a_reduce_scatter_on_the_same_stream(tmp_path):
    # a reduce-scatter runs [100, 300) on the NCCL stream; the gather launched at 101 starts at 300
    path = write_gathers(tmp_path / "q.sqlite", both(Gather("u", 100, 300, 320, 150, 160, 50, 100)), queue=(100, 300))
    g = rows_of(path)
    assert g["held_ms"].tolist() == pytest.approx([0.16, 0.16])  # end 320 - ready 160
    assert g["cause"].tolist() == ["queued", "queued"]
    assert g["queued_ms"].tolist() == pytest.approx([0.14, 0.14])  # ready 160 .. the reduce-scatter's end 300
    assert g["queued_behind"].tolist() == ["reduce_scatter:prev", "reduce_scatter:prev"]


def test_partner_when_the_other_rank_starts_its_call_later(tmp_path):
    ours = Gather("u", 100, 105, 320, 150, 160, 50, 100)
    theirs = Gather("u", 100, 300, 320, 150, 160, 50, 100)
    g = rows_of(write_gathers(tmp_path / "p.sqlite", ([ours], [theirs])))
    assert g["held_ms"].tolist() == pytest.approx([0.16, 0.16])
    assert g.loc[0, "cause"] == "partner" and g.loc[0, "last_rank"] == 1
    assert g.loc[0, "partner_ms"] == pytest.approx(0.14)  # ready 160 .. rank 1 arrives at 300
    # rank 1's own kernel started 200 µs after its launch with nothing ahead of it on its stream
    assert g.loc[1, "cause"] == "issued late" and g.loc[1, "not_started_ms"] == pytest.approx(0.14)


def test_slow_when_the_transfer_runs_under_half_the_runs_bandwidth_for_its_size(tmp_path):
    slow = Gather("u", 100, 105, 300, 150, 160, 50, 100)  # 195 µs for what the others move in 20
    fast = [
        Gather(
            n, 400 + 150 * k, 405 + 150 * k, 425 + 150 * k, 430 + 150 * k, 440 + 150 * k, 330 + 150 * k, 450 + 150 * k
        )
        for k, n in enumerate("abc")
    ]
    g = rows_of(write_gathers(tmp_path / "s.sqlite", both(slow, *fast)))
    assert g["cause"].tolist() == ["slow", "slow"]
    assert g["held_ms"].tolist() == pytest.approx([0.14, 0.14])
    assert (g["busbw_gbps"] < 0.5 * g["typical_busbw_gbps"]).all()
    others = rows_of(write_gathers(tmp_path / "s2.sqlite", both(slow, *fast)), unit="a")
    assert others["cause"].tolist() == ["in time", "in time"]


def test_a_gather_without_a_wait_range_is_not_measured_and_the_sentence_says_so(tmp_path):
    path = write_gathers(tmp_path / "u.sqlite", both(Gather("u", 100, 105, 330, None, 160, 50, 100)))
    g = rows_of(path)
    assert g["cause"].tolist() == ["unmarked", "unmarked"] and g["held_ms"].isna().all()
    (sentence,) = analyze_collectives(path).traces["in_time"].iloc[0]
    assert sentence.startswith(f"{HELD}: not measured for the 2 all-gathers in forward")
