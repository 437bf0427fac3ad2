"""`source` means one thing everywhere: what a figure was measured from, "kernels" or "ranges" (the trace,
its collective calls, each rank's comm and compute), in the frames and in every output format."""

import pytest

from analysis import analyze_collectives
from analysis.measure.activity import rank_work
from analysis.measure.collective_calls import find_calls
from analysis.overlap.analyze import analyze_trace
from analysis.run.loaded_run import load_trace
from analysis.trace.frames import KERNELS, RANGES
from tests.analysis.overlap_fixtures import write_cpu_only, write_two_ranks

PLACES = ("trace", "calls", "comm", "compute", "summary", "totals", "json", "collectives")


def sources(path):
    """Every place a source is said, each as the set of words said there."""
    trace = load_trace(path)
    works = rank_work(trace)
    result = analyze_trace(trace)
    doc = result.to_json()["traces"]
    return {
        "trace": {trace.source},
        "calls": {find_calls(trace).source},
        "comm": {w.comm_source for w in works},
        "compute": {w.compute_source for w in works},
        "summary": set(result.summary["source"]),
        "totals": set(result.totals["comm_source"]) | set(result.totals["compute_source"]),
        "json": {t["source"] for t in doc}
        | {r[k] for t in doc for r in t["ranks"] for k in ("comm_source", "compute_source")},
        "collectives": set(analyze_collectives(path).traces["source"]),
    }


@pytest.mark.parametrize(("write", "word"), [(write_two_ranks, "kernels"), (write_cpu_only, "ranges")])
def test_every_place_says_the_same_word(tmp_path, write, word):
    said = sources(write(tmp_path / "t.sqlite"))
    assert said == {place: {word} for place in PLACES}
    assert word in (KERNELS, RANGES)
