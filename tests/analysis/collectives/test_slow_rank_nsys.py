"""A real 4-rank CPU run under nsys with `--slow-rank`: the analysis names the slowed rank and the place."""

from __future__ import annotations

import shutil
import sqlite3

import pytest

from analysis.api import analyze_collectives
from contract import decode_meta
from tests import small_run

SLOW, MS, STEPS = 2, 1000, 5  # 5 steps held of 5 is past the recurrence rule's chance (0.25^5 < 1% / 4)


@pytest.mark.ranks
@pytest.mark.nsys
@pytest.mark.skipif(shutil.which("nsys") is None, reason="nsys not installed")
@pytest.mark.parametrize("place", ["data", "issue"])
def test_the_slowed_rank_is_named_with_its_place_as_cause(tmp_path, place):
    extra = ["-n", "4", "--slow-rank", f"{SLOW}:{place}:{MS}"]
    done = small_run.record(["flat"], tmp_path, STEPS, 1, *extra, timeout_s=600)
    assert done.returncode == 0, done.stderr[-3000:]
    export = tmp_path / "flat.sqlite"
    with sqlite3.connect(export) as db:
        rows = db.execute(
            "SELECT coalesce(e.text, s.value) FROM NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = e.textId"
        )
        texts = [t for (t,) in rows if t and t.startswith("ddp.meta ")]
    metas = [decode_meta(t) for t in texts]
    assert len(metas) == 4 and all(m["slow_rank"] == {"rank": SLOW, "place": place, "ms": MS} for m in metas)

    view = analyze_collectives([export])
    strag = view.stragglers
    assert len(strag) == STEPS
    assert (strag["straggler"] == SLOW).all() and (strag["cause"] == place).all()
    # the stall is what it was late by, give or take the ranks' jitter on a loaded machine
    assert ((strag["cause_ms"] > 0.5 * MS) & (strag["cause_ms"] < 1.5 * MS)).all()
    trace = view.to_json()["traces"][0]
    assert [s["cause"] for s in trace["stragglers"]] == [place] * STEPS
    (summary,) = trace["straggler_summary"]
    assert summary["rank"] == SLOW and summary["steps_held"] == STEPS and summary["recurrently_late"]
    assert summary["causes"] == {place: STEPS}
    assert summary["wait_caused_ms"] == pytest.approx(sum(s["wait_caused_ms"] for s in trace["stragglers"]))
