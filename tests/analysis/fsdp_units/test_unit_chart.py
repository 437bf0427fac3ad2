"""The per-unit all-gather chart (fsdp_units/charts.py), the per-unit table (in_time.unit_table) and the
collectives CLI's --units rows."""

import numpy as np
import pandas as pd
import pytest

from analysis.collectives import command as collectives
from analysis.fsdp_units.charts import units_figure
from analysis.fsdp_units.gather_rows import HELD
from analysis.fsdp_units.in_time import unit_table
from tests.support.synthetic_gather import Gather, write_gathers


def many_units(n: int) -> pd.DataFrame:
    """Gather rows of n units x 2 phases x 2 ranks x 3 steps; unit k held k µs per row, queued in
    backward, partner in forward; unit 0 host-bound (held 0) instead."""
    rows = []
    for step in range(3):
        for rank in (0, 1):
            for phase, cause in (("forward", "partner"), ("backward", "queued")):
                for k in range(n):
                    rows.append((rank, step, phase, f"blocks.{k}", k * 1e-3, cause if k else "host", k + 1000 * step))
    frame = pd.DataFrame(rows, columns=["rank", "step", "phase", "unit", "held_ms", "cause", "issue_ns"])
    return frame.assign(definition=HELD, queued_behind=np.where(frame["cause"] == "queued", "reduce_scatter:x", ""))


def test_170_units_are_one_bar_each_on_a_chart_of_one_screen():
    fig = units_figure(many_units(170), "fsdp")
    bars = [t for t in fig.data if t.type == "bar"]
    assert [t.name for t in bars] == [
        "waiting for the other rank's call",
        "queued behind an earlier collective on its stream",
    ]
    assert sorted(len(t.x) for t in bars) == [170, 170]
    partner = next(t for t in bars if t.legendgroup == "partner")
    assert partner.y[169] == pytest.approx(0.169)  # unit 169: 169 µs per rank-step, as ms
    assert fig.layout.height <= 1000 and fig.layout.title.yref == "container"
    assert "1014 of 1020 gathers late, 6 host-bound" in fig.layout.annotations[0].text
    named = [a.text for a in fig.layout.annotations[2:]]
    assert named[:3] == ["blocks.169", "blocks.168", "blocks.167"]


def test_unit_table_worst_first_with_main_cause_and_queue():
    table = unit_table(many_units(5))
    assert table["unit"].tolist()[:2] == ["blocks.4", "blocks.4"]
    worst = table.set_index(["phase", "unit"]).loc[("backward", "blocks.4")]
    assert worst[["held_ms_per_step", "cause", "late", "gathers"]].tolist() == [pytest.approx(0.004), "queued", 6, 6]
    assert worst["queued_behind"] == "reduce_scatter:x"
    first = table[table["unit"] == "blocks.0"]
    assert set(first["cause"]) == {"host"} and first["held_ms_per_step"].tolist() == [0.0, 0.0]
    assert table.set_index(["phase", "unit"]).loc[("forward", "blocks.3"), "order"] == 4


def test_the_cli_prints_the_phase_sentences_and_the_worst_units(tmp_path, capsys):
    g = Gather("u", 100, 300, 320, 150, 160, 50, 100)
    path = write_gathers(tmp_path / "q.sqlite", ([g], [g]), queue=(100, 300))
    assert collectives.main([str(path), "--summary", "--units", "5"]) == 0
    out = capsys.readouterr().out
    assert (
        "held (GPU: compute stream waiting): all-gathers in time for 0 of 1 layers in forward; the late ones cost "
        "0.16 ms/step; worst: u (0.16 ms); late gathers by cause: queued 2"
    ) in out
    line = next(x for x in out.splitlines() if x.strip().startswith("forward"))
    assert line.split() == ["forward", "u", "1", "0.160", "2", "2", "queued", "0", "reduce_scatter:prev"]
    assert collectives.main([str(path), "--summary", "--units", "0"]) == 0
    assert "per unit and phase" not in capsys.readouterr().out


def test_a_phase_with_nothing_late_still_draws_its_units():
    rows = many_units(4).assign(cause="in time", held_ms=0.0)
    fig = units_figure(rows, "fsdp")
    assert [(t.name, len(t.x)) for t in fig.data] == [("no late gather", 4), ("no late gather", 4)]
