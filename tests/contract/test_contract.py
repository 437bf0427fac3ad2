"""The NVTX contract from the outside: names and metadata text written as literals (a renamed range must fail
here), `ddp.meta` round-trips, bad metadata is skipped, the default patterns match the names, and the
package stays importable without torch or the project's other packages."""

import json
import re
import subprocess
import sys

import pytest

import contract
from contract import patterns as defaults
from tests.profiling.test_nsys import REPO


def test_range_names_are_the_documented_ones():
    assert (contract.PROFILE, contract.FORWARD, contract.BACKWARD, contract.OPTIMIZER, contract.GRAD_SYNC) == (
        "profile",
        "forward",
        "backward",
        "optimizer",
        "grad_sync",
    )
    assert contract.step_range(0) == "step 0" and contract.step_range(17) == "step 17"
    assert contract.comm_range(contract.ALL_REDUCE, "bucket3") == "comm:all_reduce:bucket3"
    assert contract.comm_range(contract.BROADCAST, "params") == "comm:broadcast:params"
    assert contract.comm_range("all_reduce", "layers.0.attn.wq.weight") == "comm:all_reduce:layers.0.attn.wq.weight"
    assert contract.P2P_PHASES == (
        "ring:reduce_scatter",
        "ring:all_gather",
        "reduce_broadcast:reduce",
        "reduce_broadcast:broadcast",
    )
    assert contract.COMM_PAYLOAD == "bytes"
    assert contract.comm_range(contract.ALL_GATHER, "layers.0.attn.wq") == "comm:all_gather:layers.0.attn.wq"
    assert contract.comm_range(contract.REDUCE_SCATTER, "fc1") == "comm:reduce_scatter:fc1"
    assert contract.SHARDED_OPS == ("all_gather", "reduce_scatter")


def test_sharded_entry_counts_bytes_in_nccl_tests_convention():
    # 10 elements over 4 ranks pad to 12; bf16 on the wire, float32 shards: 24 bytes gathered, 3 * 4 stored
    entry = contract.sharded_entry("fc1", ["fc1.weight", "fc1.bias"], 10, 12, 2, 4, 4)
    assert entry == {
        "name": "fc1",
        "params": ["fc1.weight", "fc1.bias"],
        "numel": 10,
        "padded_numel": 12,
        "all_gather_bytes": 24,
        "reduce_scatter_bytes": 24,
        "shard_bytes": 12,
    }
    assert tuple(entry) == contract.SHARDED_FIELDS and contract.SHARDED_KEY == "sharded"
    meta = {"rank": 0, contract.SHARDED_KEY: [entry]}
    assert contract.decode_meta(contract.encode_meta(meta)) == meta


@pytest.mark.parametrize(("numel", "padded"), [(10, 9), (10, 10), (10, 14)])
def test_sharded_entry_refuses_padding_that_does_not_split(numel, padded):
    with pytest.raises(ValueError, match=f"padded_numel {padded}"):
        contract.sharded_entry("fc1", ["fc1.weight"], numel, padded, 4, 4, 4)


def test_comm_range_rejects_an_op_that_would_shift_the_tag():
    for op in ("", "all:reduce"):
        with pytest.raises(ValueError, match=re.escape(repr(op))):
            contract.comm_range(op, "x")


def test_is_comm_range():
    assert contract.is_comm_range("comm:all_reduce:flat")
    assert not contract.is_comm_range("grad_sync") and not contract.is_comm_range("ncclAllReduce")


def test_meta_is_prefix_then_one_line_of_sorted_json():
    meta = {"rank": 1, "implementation": "overlap", "versions": {"nvtx": "0.2.10"}}
    text = contract.encode_meta(meta)
    assert text == 'ddp.meta {"implementation":"overlap","rank":1,"versions":{"nvtx":"0.2.10"}}'
    assert json.loads(text[len("ddp.meta ") :]) == meta


@pytest.mark.parametrize(
    "meta",
    [
        {},
        {"rank": 0, "world_size": 2, "buckets": [{"name": "bucket0", "bytes": 12}]},
        {"text": "line\nbreak", "unicode": "µs", "nested": {"a": [1, 2.5, None, True]}},
    ],
)
def test_meta_round_trips(meta):
    text = contract.encode_meta(meta)
    assert "\n" not in text
    assert contract.decode_meta(text) == meta


def test_meta_values_json_cannot_hold_become_strings():
    from pathlib import Path

    assert contract.decode_meta(contract.encode_meta({"path": Path("/tmp/x")})) == {"path": "/tmp/x"}


@pytest.mark.parametrize(
    "text",
    [
        "ddp.meta {not json",
        "ddp.meta [1, 2]",
        "ddp.meta 3",
        'ddp.meta "rank"',
        "ddp.meta null",
        "ddp.meta ",
        "ddp.meta{}",
        'other {"rank": 0}',
        "",
        None,
    ],
)
def test_bad_or_foreign_meta_decodes_to_none(text):
    assert contract.decode_meta(text) is None


def test_kineto_keys():
    assert (contract.META_KEY, contract.ASYNC_KIND_KEY, contract.ASYNC_KIND) == ("ddp.meta", "ddp.kind", "start_end")
    assert contract.PAYLOAD_KEY == "ddp.payload"


def test_default_patterns_match_the_names():
    search = lambda pattern, text: re.search(pattern, text) is not None
    assert re.search(defaults.STEP, contract.step_range(42)).group(1) == "42"
    assert search(defaults.FORWARD_PHASE, contract.FORWARD) and search(defaults.BACKWARD_PHASE, contract.BACKWARD)
    assert search(defaults.OPTIMIZER_PHASE, contract.OPTIMIZER) and search(defaults.SYNC_WAIT, contract.GRAD_SYNC)
    assert search(defaults.COMM_RANGE, contract.comm_range(contract.ALL_REDUCE, "bucket0"))
    assert search(defaults.COMM_RANGE, contract.comm_range(contract.BROADCAST, "bucket_order"))
    for op in contract.SHARDED_OPS:
        assert search(defaults.COMM_RANGE, contract.comm_range(op, "layers.0.ffn.w1"))
    # and nothing else of the contract: each name belongs to exactly one pattern
    names = [
        contract.PROFILE,
        contract.FORWARD,
        contract.BACKWARD,
        contract.OPTIMIZER,
        contract.GRAD_SYNC,
        contract.step_range(3),
        contract.comm_range("all_reduce", "flat"),
        *contract.P2P_PHASES,
    ]
    for pattern in (
        defaults.STEP,
        defaults.FORWARD_PHASE,
        defaults.BACKWARD_PHASE,
        defaults.OPTIMIZER_PHASE,
        defaults.SYNC_WAIT,
        defaults.COMM_RANGE,
    ):
        assert sum(search(pattern, n) for n in names) == 1, pattern


def test_analysis_defaults_are_the_contract_patterns():
    from analysis.trace.patterns import Patterns

    p = Patterns()  # the comm-kernel default is not ours to choose: analysis.trace.comm_families
    assert (p.comm_range, p.step, p.forward, p.backward, p.optimizer, p.sync_wait) == (
        defaults.COMM_RANGE,
        defaults.STEP,
        defaults.FORWARD_PHASE,
        defaults.BACKWARD_PHASE,
        defaults.OPTIMIZER_PHASE,
        defaults.SYNC_WAIT,
    )


def test_contract_imports_nothing_of_torch_or_the_project():
    code = (
        "import sys, contract, contract.names, contract.meta, contract.patterns, contract.nsys_cli; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in {'torch', 'ddp', 'analysis', 'profiling', "
        "'numpy', 'pandas'}))"
    )
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[]"
