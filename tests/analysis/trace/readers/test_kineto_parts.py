"""A large Kineto file's events decoded in pieces on several cores (kineto_parts.py) give exactly the
serial decode's columns: pieces cover the event text at event boundaries, a boundary inside a string
falls back to the serial decode, a worker that dies leaves the work to this process, and one that
fails says why here. Pieces started before the analysis is imported (kineto_json.start_read) give the
same columns, and workers never taken are stopped and reaped."""

import gzip
import itertools
import os
import re
import threading

import numpy as np
import pytest

from analysis.errors import TraceError
from analysis.trace.readers import kineto_json, kineto_parts
from analysis.trace.readers.kineto_json import read_kineto
from analysis.trace.readers.kineto_parts import Workers, decode_in_parts, pieces
from tests.analysis.trace.readers.test_kineto_json import same_columns
from tests.support.synthetic_kineto import KinetoWriter, write_kineto_ddp_trace

CUT = re.compile(rb"\}\s*,\s*\{")


@pytest.fixture
def three_cores(monkeypatch):
    monkeypatch.setattr(kineto_parts, "usable_cores", lambda: 3)
    monkeypatch.setattr(kineto_parts, "PART_BYTES", 1)


def test_pieces_cover_the_text_at_event_boundaries(three_cores):
    text = b"[" + b",\n".join(b'{"ph": "X", "name": "e%d"}' % i for i in range(50)) + b"]"
    spans = pieces(text, 1, len(text) - 1, CUT)
    assert len(spans) == 3
    assert spans[0][0] == 1 and spans[-1][1] == len(text) - 1
    for (_, stop), (start, _) in itertools.pairwise(spans):
        assert text[stop - 1 : stop] == b"}" and text[start : start + 1] == b"{"
        assert text[stop:start].strip() == b","  # nothing between two pieces but the comma
    names = [m for a, b in spans for m in re.findall(rb'"e\d+"', text[a:b])]
    assert names == [b'"e%d"' % i for i in range(50)]  # every event once, in order


def read_both(path, monkeypatch) -> tuple:
    monkeypatch.setattr(kineto_parts, "usable_cores", lambda: 3)
    monkeypatch.setattr(kineto_parts, "PART_BYTES", 1)
    monkeypatch.setattr(kineto_json, "BATCH_BYTES", 2000)
    parted = read_kineto(path)
    monkeypatch.setattr(kineto_parts, "PART_BYTES", 1 << 40)
    return parted, read_kineto(path)


def test_read_in_pieces_equals_the_serial_read(tmp_path, monkeypatch):
    (path,) = write_kineto_ddp_trace(tmp_path / "run", n_kernels=3000, n_steps=2, comm_per_step=3)
    parted, serial = read_both(path, monkeypatch)
    same_columns(parted, serial)
    assert len(parted.gpu["start"]) == 3000
    assert [c[:4] for c in parted.comms] == [c[:4] for c in serial.comms]
    np.testing.assert_array_equal(parted.host_pids, serial.host_pids)


def test_piece_boundary_inside_a_string_reads_as_the_serial_read(tmp_path, monkeypatch):
    w = KinetoWriter(tmp_path / "t.json")
    n = 300
    start = w.base + np.arange(n) * 10_000
    names = np.array(['k {"a": 1}, {"b": [2]}', "f<{lambda()#1}, {lambda()#2}>"], dtype=object)[np.arange(n) % 2]
    w.kernels(7, 8, 0, 7, start + 1_000, start + 6_000, names, launch=start)
    w.nvtx(7, 7, [w.base], [w.base + n * 10_000], ["step 0"])
    w.close()

    def in_a_name(data: bytes, start: int, stop: int, cut: re.Pattern[bytes]) -> list[tuple[int, int]]:
        inside = cut.match(data, data.index(b'}, {\\"b', start))  # a "}, {" of a kernel's name
        return [(start, inside.start() + 1), (inside.end() - 1, stop)]

    serial = read_kineto(tmp_path / "t.json")
    whole_decodes = []
    decode_top = kineto_json._decode_top
    monkeypatch.setattr(kineto_json, "pieces", in_a_name)
    monkeypatch.setattr(kineto_json, "_decode_top", lambda *a: whole_decodes.append(1) or decode_top(*a))
    parted = read_kineto(tmp_path / "t.json")
    assert whole_decodes == [1]  # the pieces failed to decode: the file was decoded the serial way
    same_columns(parted, serial)
    assert sorted(set(parted.gpu["name"].values())) == sorted(set(names))


def test_a_dead_worker_leaves_its_piece_to_this_process():
    parent = os.getpid()

    def decode(start: int, stop: int) -> list:
        if os.getpid() != parent:
            os._exit(1)  # a worker killed, as the kernel's OOM killer would
        return [(start, stop)]

    spans = [(0, 10), (10, 20), (20, 30)]
    assert decode_in_parts(decode, spans) == spans


def test_no_workers_from_a_thread_other_than_the_main_one(monkeypatch):
    monkeypatch.setattr(kineto_parts, "PART_BYTES", 1)
    text = b"[" + b",".join(b'{"a": %d}' % i for i in range(20)) + b"]"
    got = []
    worker = threading.Thread(target=lambda: got.append(pieces(text, 1, len(text) - 1, CUT)))
    worker.start()
    worker.join()
    assert got == [[(1, len(text) - 1)]] and kineto_parts.usable_cores() >= 1


def started_pieces(path, monkeypatch) -> kineto_json._Started:
    """start_read on `path` as a CLI calls it, pieces of a few kB on three cores."""
    monkeypatch.setattr(kineto_parts, "usable_cores", lambda: 3)
    monkeypatch.setattr(kineto_parts, "PART_BYTES", 4096)
    monkeypatch.setattr(kineto_json, "BATCH_BYTES", 2000)
    kineto_json.start_read(path, path.read_bytes()[:16])
    return kineto_json._STARTED[path]


def test_a_started_read_equals_the_serial_read(tmp_path, monkeypatch):
    (path,) = write_kineto_ddp_trace(tmp_path / "run", n_kernels=3000, n_steps=2, comm_per_step=3)
    started = started_pieces(path, monkeypatch)
    assert started.workers is not None and len(started.workers.running) == 3
    sent = []  # whether each worker's result came back (None: its piece decoded here instead)
    received = kineto_parts._received
    monkeypatch.setattr(kineto_parts, "_received", lambda *a: sent.append(received(*a)) or sent[-1])
    got = read_kineto(path)
    assert kineto_json._STARTED == {} and started.workers.running == []  # taken, and the workers reaped
    assert len(sent) == 3 and all(isinstance(r, list) and r for r in sent)  # every piece from its worker
    monkeypatch.setattr(kineto_parts, "PART_BYTES", 1 << 40)
    serial = read_kineto(path)
    same_columns(got, serial)
    assert len(got.gpu["start"]) == 3000 and [c[:4] for c in got.comms] == [c[:4] for c in serial.comms]


def test_discarded_workers_are_stopped_and_reaped(tmp_path, monkeypatch):
    (path,) = write_kineto_ddp_trace(tmp_path / "run", n_kernels=3000, n_steps=2, comm_per_step=3)
    pids = [pid for pid, _ in started_pieces(path, monkeypatch).workers.running]
    kineto_json.discard_started()
    assert kineto_json._STARTED == {}
    for pid in pids:
        with pytest.raises(ChildProcessError):  # reaped: no zombie left for this process to wait for
            os.waitpid(pid, os.WNOHANG)


def test_a_gzipped_or_small_file_is_not_started(tmp_path, monkeypatch):
    (path,) = write_kineto_ddp_trace(tmp_path / "run", n_kernels=3000, n_steps=2, comm_per_step=3)
    packed = tmp_path / "run.json.gz"
    packed.write_bytes(gzip.compress(path.read_bytes()))
    monkeypatch.setattr(kineto_parts, "usable_cores", lambda: 3)
    kineto_json.start_read(path, path.read_bytes()[:16])  # 64 MB pieces: too small to cut
    monkeypatch.setattr(kineto_parts, "PART_BYTES", 4096)
    kineto_json.start_read(packed, packed.read_bytes()[:16])
    assert kineto_json._STARTED == {}


def test_a_worker_error_is_raised_here():
    def decode(start: int, stop: int) -> list:
        raise TraceError(f"bad piece {start}")

    workers = Workers(decode, [(0, 10), (10, 20)])
    with pytest.raises(TraceError, match="bad piece 0"):
        workers.results()
    workers.close()
    assert workers.running == []


def test_a_result_cut_short_leaves_its_piece_to_this_process(monkeypatch):
    """A worker that ends well but whose result file holds a broken pickle (written in part): decoded here."""
    parent = os.getpid()
    monkeypatch.setattr(kineto_parts.pickle, "dump", lambda obj, out, protocol: out.write(b"\x80\x05\x95"))

    def decode(start: int, stop: int) -> list:
        return [(start, stop, os.getpid() == parent)]

    workers = Workers(decode, [(0, 10), (10, 20)])
    assert workers.results() == [(0, 10, True), (10, 20, True)]
