"""once_per_trace: a per-trace measure is computed once per trace object and patterns, and its result
goes with the trace."""

import dataclasses
import gc

from analysis.engine.runs import load_trace
from analysis.frames import memo
from analysis.frames.patterns import Patterns
from analysis.measures.activity import rank_work
from analysis.measures.backward_span import backward_spans
from tests.support.synthetic_ddp import write_ddp_trace


def test_computed_once_per_trace_and_patterns():
    calls = []

    @memo.once_per_trace
    def measure(trace, patterns):
        calls.append((trace, patterns))
        return [len(calls)]

    class Fake:  # any object that can be weakly referenced stands in for a trace
        pass

    a, b = Fake(), Fake()
    assert measure(a) is measure(a, Patterns()) is measure(a, None)  # None means the default patterns
    assert len(calls) == 1
    other = Patterns(step=r"^iter (\d+)$")
    assert measure(a, other) == [2] and measure(b) == [3] and measure(a) == [1]
    assert len(calls) == 3


def test_results_go_with_their_trace():
    @memo.once_per_trace
    def measure(trace, patterns):
        return object()

    class Fake:
        pass

    before = memo.cached_count()
    traces = [Fake() for _ in range(3)]
    for t in traces:
        measure(t)
    assert memo.cached_count() == before + 3
    del traces, t
    gc.collect()
    assert memo.cached_count() == before  # nothing kept for traces that are gone (ids may be reused)


def test_real_measures_shared_and_equal_to_a_fresh_computation(tmp_path):
    path = write_ddp_trace(tmp_path / "ddp.sqlite", n_kernels=3_000, n_ranks=2, n_steps=3)
    trace = load_trace([path])
    works, spans = rank_work(trace), backward_spans(trace)
    assert rank_work(trace, Patterns()) is works and backward_spans(trace) is spans
    # a copy of the trace is another object: computed afresh, to the same figures
    copy = dataclasses.replace(trace)
    fresh_works, fresh_spans = rank_work(copy), backward_spans(copy)
    assert fresh_works is not works and fresh_spans is not spans
    assert fresh_spans.equals(spans)
    for w, f in zip(works, fresh_works, strict=True):
        assert (w.rank, w.part, w.pid, w.device) == (f.rank, f.part, f.pid, f.device)
        assert w.windows.equals(f.windows)
        for level in ("steps", "whole"):
            mine, theirs = getattr(w, level), getattr(f, level)
            for items in ("comm", "compute", "backward"):
                assert (getattr(mine, items).start == getattr(theirs, items).start).all()
                assert (getattr(mine, items).end == getattr(theirs, items).end).all()
