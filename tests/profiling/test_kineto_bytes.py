"""`fsdp` recorded on 2 gloo ranks both ways, under nsys and with `--profiler torch`: the collectives
view gives every (op, unit) the same bytes from either trace, and the torch.profiler trace's comm ranges
carry exactly the payloads `ddp.meta` lists for each sharded unit (read here in plain Python from the
JSON: `args["ddp.payload"]` of each `comm:*` user_annotation event)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from analysis.collectives.collectives_view import collectives_of
from analysis.run.loaded_run import load_trace
from contract import PAYLOAD_KEY
from tests.support.nsys import RECORDS_WITH_NSYS
from tests.support.recordings import STEPS

pytestmark = RECORDS_WITH_NSYS


@pytest.fixture(scope="module")
def recorded(nsys_recordings, torch_recordings) -> tuple[Path, list[Path]]:
    """(the nsys export, the torch.profiler rank files) of the same fsdp run, recorded both ways."""
    return nsys_recordings("fsdp") / "fsdp.sqlite", sorted(torch_recordings("fsdp").glob("fsdp.rank*.json.gz"))


def _bytes_by_op_unit(calls) -> dict:
    return {key: sorted(group.tolist()) for key, group in calls.groupby(["rank", "op", "tag"])["bytes"]}


def test_kineto_bytes_equal_the_nsys_bytes_of_each_op_and_unit(recorded):
    sqlite, jsons = recorded
    nsys = collectives_of([load_trace(sqlite)]).calls
    kineto = collectives_of([load_trace(jsons)]).calls
    assert nsys["bytes"].notna().all() and kineto["bytes"].notna().all()  # none unknown either way
    assert _bytes_by_op_unit(kineto) == _bytes_by_op_unit(nsys)
    assert set(kineto["op"]) == {"all_gather", "reduce_scatter", "all_reduce"}


def test_the_torch_profiler_ranges_carry_ddp_meta_s_unit_bytes(recorded):
    _, jsons = recorded
    assert len(jsons) == 2
    for path in jsons:
        doc = json.loads(gzip.decompress(path.read_bytes()))
        units = {u["name"]: u for u in doc["ddp.meta"]["sharded"]}
        ranges = [e for e in doc["traceEvents"] if e.get("cat") == "user_annotation" and e["name"].startswith("comm:")]
        assert ranges and all(PAYLOAD_KEY in e["args"] for e in ranges)  # every comm range has its payload
        for e in ranges:
            _, op, tag = e["name"].split(":", 2)
            if op in ("all_gather", "reduce_scatter"):
                assert e["args"][PAYLOAD_KEY] == units[tag][f"{op}_bytes"], e["name"]
        gathers = sum(e["name"].startswith("comm:all_gather:") for e in ranges)
        assert gathers == 2 * STEPS * len(units)  # forward and backward, every unit, every step
