"""The Kineto JSON reader's shortcuts: the event array found without a pass over it (`_split_top`) and
memory-mapped plain files give exactly what decoding the whole document gives, on awkward layouts
too; where the shortcut cannot be checked, the whole decode takes over."""

import gzip
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis.trace.readers import kineto_events, kineto_json
from analysis.trace.readers.kineto_json import _decode_top, _raw_bounds, _split_top, read_kineto
from tests.support.synthetic_kineto import write_kineto_ddp_trace

REAL = Path(__file__).resolve().parents[5] / "shared" / "data" / "kineto_ddp_2rank_nccl.json.gz"

KERNEL = {
    "ph": "X",
    "cat": "kernel",
    "name": "k}]",
    "pid": 0,
    "tid": 7,
    "ts": 10.5,
    "dur": 2.0,
    "args": {"device": 0, "stream": 7, "correlation": 1, "grid": [1, 1, 1], "nested": [{"a": "}]"}]},
}
STEP = {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 5, "tid": 5, "ts": 1.0, "dur": 30.0}
COMM = {
    "ph": "X",
    "cat": "cpu_op",
    "name": "record_param_comms",
    "pid": 5,
    "tid": 6,
    "ts": 12.0,
    "dur": 3.0,
    "args": {"Collective name": "allreduce", "In msg nelems": 4, "Out msg nelems": 4, "dtype": "Float"},
}
EVENTS = [KERNEL, STEP, COMM, {"ph": "f", "id": 1, "pid": 0, "tid": 7, "ts": 10.5, "cat": "ac2g", "name": "ac2g"}]


def layouts() -> dict[str, str]:
    """Documents whose event array is hard to find by looking at brackets. In `dicts_after` the quick
    split takes the list after the events for their end (decoding the events finds it out); with
    `nested_key_first` it finds none: both are read by decoding the whole."""
    events = json.dumps(EVENTS, indent=2)
    return {
        "kineto": f'{{"schemaVersion": 1, "traceEvents": {events}, "traceName": "x.json", "baseTimeNanoseconds": 7}}',
        "logs_after": f'{{"traceEvents": {events}, "logs": ["INFO a.cpp:12] done", "x}}]"], "baseTimeNanoseconds": 7}}',
        "dicts_after": f'{{"traceEvents": {events}, "deviceProperties": [{{"id": 0}}, {{"id": 1}}]}}',
        "nested_key_first": f'{{"meta": {{"traceEvents": [{{"a": 1}}]}}, "traceEvents": {events}}}',
        "key_in_string_first": f'{{"note": "\\"traceEvents\\": [", "traceEvents": {events}}}',
        "empty": '{"traceEvents": [ ], "baseTimeNanoseconds": 7}',
        "spaces": f'{{ "traceEvents" :\n [\n{events[1:-1]}\n ] \n, "distributedInfo": {{"rank": 0}} }}',
    }


def whole_decode_bounds(data: bytes) -> tuple[int, int]:
    return _raw_bounds(Path("t"), data, _decode_top(Path("t"), data).traceEvents)[1:]


@pytest.mark.parametrize("layout", ["kineto", "logs_after", "key_in_string_first", "spaces", "empty"])
def test_split_found_where_kineto_puts_things(layout):
    data = layouts()[layout].encode()
    doc, first, last = _split_top(data)
    assert (first, last) == whole_decode_bounds(data)
    whole = _decode_top(Path("t"), data)
    assert (doc.baseTimeNanoseconds, doc.distributedInfo) == (whole.baseTimeNanoseconds, whole.distributedInfo)


def column(values) -> np.ndarray:
    """A KinetoFile column as an array (a categorical column's strings)."""
    return np.asarray(values, dtype=object) if isinstance(values, pd.Categorical) else np.asarray(values)


def same_columns(a: kineto_json.KinetoFile, b: kineto_json.KinetoFile) -> None:
    for family in ("gpu", "runtime", "ranges", "autograd", "comms"):
        x, y = getattr(a, family), getattr(b, family)
        assert x.keys() == y.keys()
        for k in x:
            np.testing.assert_array_equal(column(x[k]), column(y[k]), err_msg=f"{family}.{k}")
    assert (a.clock_offset, a.distributed, a.meta, a.info) == (b.clock_offset, b.distributed, b.meta, b.info)


@pytest.mark.parametrize("layout", sorted(layouts()))
def test_read_equals_whole_decode(tmp_path, monkeypatch, layout):
    path = tmp_path / "t.json"
    path.write_text(layouts()[layout])
    quick = read_kineto(path)
    assert [a.collective for a in quick.comms["args"]] == ([] if layout == "empty" else ["allreduce"])
    monkeypatch.setattr(kineto_json, "_split_top", lambda data: None)
    same_columns(quick, read_kineto(path))


def test_memory_mapped_file_reads_as_the_copy(tmp_path, monkeypatch):
    (path,) = write_kineto_ddp_trace(tmp_path / "run", n_kernels=3000, n_steps=2, comm_per_step=3)
    monkeypatch.setattr(kineto_json, "MMAP_BYTES", 0)
    mapped = read_kineto(path)
    assert len(mapped.gpu["start"]) == 3000
    monkeypatch.setattr(kineto_json, "MMAP_BYTES", 1 << 40)
    same_columns(mapped, read_kineto(path))


@pytest.mark.skipif(not REAL.exists(), reason="shared data absent")
def test_split_of_the_real_trace_is_the_whole_decodes():
    data = gzip.decompress(REAL.read_bytes())
    doc, first, last = _split_top(data)
    assert (first, last) == whole_decode_bounds(data)
    assert doc.distributedInfo["world_size"] == 2 and doc.baseTimeNanoseconds == 1711964646000000000


def test_named_pids_are_no_process_ids(tmp_path, monkeypatch):
    """A pid or tid that is a name (Chrome's "Spans") reads as -1, in whichever batch it comes."""
    kernels = [{**KERNEL, "name": f"k{i}", "ts": 100.0 + i, "args": {"device": 0, "stream": 7}} for i in range(400)]
    named = {"ph": "X", "cat": "user_annotation", "name": "span", "pid": "Spans", "tid": "PyTorch", "ts": 1, "dur": 9}
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": [*kernels[:300], named, STEP, *kernels[300:]]}, indent=1))
    monkeypatch.setattr(kineto_events, "BATCH_BYTES", 2_000)  # many batches: integer ones, then the named one
    got = read_kineto(path)
    assert got.ranges["pid"].tolist() == [-1, 5] and got.ranges["tid"].tolist() == [-1, 5]
    assert len(got.gpu["start"]) == 400


@pytest.mark.parametrize("names", ["plain", "cut text"])
def test_pieces_decoded_by_forked_processes_read_as_the_whole(tmp_path, monkeypatch, names):
    """A mapped file cut into pieces gives the serial read's columns; where a cut falls inside a name (its
    piece fails to decode), the whole decode gives them."""
    name = 'k}, {"a": [' if names == "cut text" else "k"
    kernels = [{**KERNEL, "name": f"{name}{i % 7}", "ts": 100.0 + i, "args": {"device": 0}} for i in range(3000)]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": [STEP, *kernels], "baseTimeNanoseconds": 7}, indent=1))
    serial = read_kineto(path)
    monkeypatch.setattr(kineto_json, "MMAP_BYTES", 0)
    monkeypatch.setattr(kineto_json, "PIECE_BYTES", 4096)
    monkeypatch.setattr(kineto_json, "read_workers", lambda: 3)
    cut = []
    pieces = kineto_json._pieces
    monkeypatch.setattr(kineto_json, "_pieces", lambda *a: cut.append(pieces(*a)) or cut[-1])
    same_columns(serial, read_kineto(path))
    assert len(cut[0]) == 3 and len(serial.gpu["start"]) == 3000
