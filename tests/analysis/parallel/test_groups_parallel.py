"""A 64-rank HSDP run as 8 host files: serial, `--jobs 2` and Dask give the same JSON, process groups included,
and the per-file merge gives every rank's groups and totals as the run loaded in one piece."""

from __future__ import annotations

import json

import pytest

from analysis.overlap import command as overlap
from tests.support.synthetic_groups import write_hsdp_trace

SHAPE = {"shard": 8, "replicas": 8, "steps": 2, "calls": 2}


@pytest.fixture(scope="module")
def host_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hosts")
    files = [
        write_hsdp_trace(folder / f"hsdp.host{h}.sqlite", **SHAPE, ranks=range(8 * h, 8 * h + 8)) for h in range(8)
    ]
    return files, write_hsdp_trace(folder / "whole.sqlite", **SHAPE)


def _json(capsys, *args) -> str:
    assert overlap.main([*map(str, args), "--format", "json", "--no-cache"]) == 0
    return capsys.readouterr().out


@pytest.mark.pool  # a process pool and a Dask cluster
def test_serial_jobs_and_dask_agree_and_equal_the_one_piece_load(host_files, dask_cluster, capsys):
    files, whole = host_files
    serial = _json(capsys, *files, "--merge", "--jobs", "1")
    assert _json(capsys, *files, "--merge", "--jobs", "2") == serial
    assert _json(capsys, *files, "--merge", "--dask", dask_cluster) == serial
    merged, one = (json.loads(doc)["traces"][0]["ranks"] for doc in (serial, _json(capsys, whole)))
    assert len(merged) == 64 and [r["groups"] for r in merged] == [r["groups"] for r in one]
    assert [r["total"] for r in merged] == [r["total"] for r in one]
    assert {len(r["groups"]) for r in merged} == {2}
