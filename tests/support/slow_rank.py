"""What a real recording made with `--slow-rank RANK:PLACE:MS` must show: the recorded setting in every rank's
ddp.meta, and analysis.collectives naming the slowed rank with its place as the cause of every measured step.

The `data` case reads a recording made for other tests too (tests/analysis/collectives/
test_hsdp_recording.py, hsdp on 4 ranks): one recording fewer; `issue`: tests/analysis/collectives/
test_slow_rank_nsys.py, flat on 4 ranks."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from analysis.api import analyze_collectives
from contract import decode_meta


def slow_rank_args(rank: int, place: str, ms: int) -> list[str]:
    """The run_nsys.sh option that slows `rank` by `ms` at `place` every step."""
    return ["--slow-rank", f"{rank}:{place}:{ms}"]


def assert_the_slowed_rank_is_named_with_its_place_as_cause(
    export: Path, world: int, steps: int, rank: int, place: str, ms: int
) -> None:
    """Every rank's ddp.meta carries the slow rank; every one of the `steps` measured steps is held by `rank`,
    with `place` as the cause and about `ms` as what it was late by; the summary calls it recurrently late."""
    with sqlite3.connect(export) as db:
        rows = db.execute(
            "SELECT coalesce(e.text, s.value) FROM NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = e.textId"
        )
        texts = [t for (t,) in rows if t and t.startswith("ddp.meta ")]
    metas = [decode_meta(t) for t in texts]
    assert len(metas) == world and all(m["slow_rank"] == {"rank": rank, "place": place, "ms": ms} for m in metas)

    view = analyze_collectives([export])
    strag = view.stragglers
    assert len(strag) == steps
    assert (strag["straggler"] == rank).all() and (strag["cause"] == place).all()
    # the stall is what it was late by, give or take the ranks' jitter on a loaded machine
    assert ((strag["cause_ms"] > 0.5 * ms) & (strag["cause_ms"] < 1.5 * ms)).all()
    trace = view.to_json()["traces"][0]
    assert [s["cause"] for s in trace["stragglers"]] == [place] * steps
    (summary,) = trace["straggler_summary"]
    assert summary["rank"] == rank and summary["steps_held"] == steps and summary["recurrently_late"]
    assert summary["causes"] == {place: steps}
    assert summary["wait_caused_ms"] == pytest.approx(sum(s["wait_caused_ms"] for s in trace["stragglers"]))
