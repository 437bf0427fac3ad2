"""torch_fsdp's gathered memory on every supported torch: where FSDP2 keeps its FSDPParams (the singular group
of torch 2.9-2.12, the list of 2.13 on), and "n/a", never a crash, where they cannot be found. The figures
themselves, counted through the same lookup, are pinned on 2 ranks in test_torch_fsdp.py
(test_memory_parts_are_the_shards_and_the_gathered_units: one rank gathers nothing) on each torch that
scripts/test_torch_versions.sh runs."""

from __future__ import annotations

import importlib.util
import json
import sys
from types import SimpleNamespace

import pytest
import torch

from ddp import TorchFSDP, benchmark_rows
from ddp.cli import format_records
from ddp.memory.accounting import SavedTensorBytes
from ddp.memory.fsdp2_gathered import fsdp_params_of, param_groups
from ddp.strategies import torch_fsdp
from ddp.training.config import RunConfig
from ddp.training.loop import TrainResult, make_optimizer, memory_figures, train_step
from tests.ddp import cases


class GroupsAndFailingSingular:
    """torch 2.13's FSDPState with a grouped `fully_shard([a, b])`: the singular property raises."""

    _fsdp_param_groups = ("a", "b")

    @property
    def _fsdp_param_group(self) -> object:
        raise AssertionError("2.13 raises here when a state holds several groups")


def test_param_groups_reads_the_list_else_the_one_group_else_says_none():
    group = object()
    assert param_groups(SimpleNamespace(_fsdp_param_groups=[group])) == [group]  # torch >= 2.13
    assert param_groups(GroupsAndFailingSingular()) == ["a", "b"]  # the list wins: the singular is not touched
    assert param_groups(SimpleNamespace(_fsdp_param_group=group)) == [group]  # torch 2.9 to 2.12
    assert param_groups(SimpleNamespace(_fsdp_param_group=None)) == []  # a unit without parameters of its own
    assert param_groups(SimpleNamespace()) is None  # a torch that keeps them elsewhere


def test_fsdp_params_of_says_none_where_a_module_has_no_state_groups_or_fsdp_param_api():
    def module(*groups: object) -> SimpleNamespace:
        return SimpleNamespace(_get_fsdp_state=lambda: SimpleNamespace(_fsdp_param_groups=list(groups)))

    api = dict(alloc_all_gather_outputs=None, free_unsharded_param=None, all_gather_outputs=[])
    param = SimpleNamespace(**api)
    assert fsdp_params_of([module(SimpleNamespace(fsdp_params=[param])), module()]) == [param]
    assert fsdp_params_of([module(SimpleNamespace(fsdp_params=[param])), SimpleNamespace()]) is None  # no state
    assert fsdp_params_of([module(SimpleNamespace())]) is None  # a group without fsdp_params
    assert fsdp_params_of([module(SimpleNamespace(fsdp_params=[SimpleNamespace(all_gather_outputs=[])]))]) is None


def test_the_fsdp_params_found_on_this_torch_are_every_units_sharded_parameters(one_rank_group):
    model = TorchFSDP(cases.build("tied", 0))
    found = fsdp_params_of(unit for _, unit in model.units)
    assert found is not None
    assert sorted(id(p.sharded_param) for p in found) == sorted(id(p) for p in model.module.parameters())


def train_one_step(model: TorchFSDP) -> dict:
    optimizer = make_optimizer("sgd", model.parameters(), 0.01)
    with SavedTensorBytes([*model.module.parameters()], model.holds_weights) as activations:
        train_step(model, optimizer, cases.batch(0, 8), 0)
    return memory_figures(model, optimizer, activations)


def test_fsdp_params_not_found_trains_and_reads_na_in_the_tables_and_null_in_json(one_rank_group, monkeypatch):
    monkeypatch.setattr(torch_fsdp, "fsdp_params_of", lambda _modules: None)
    model = TorchFSDP(cases.build("toy", 0))
    figures = train_one_step(model)
    assert figures["gathered"] is None and figures["peak"] is None
    assert figures["parameters"] > 0 and figures["activations"] > 0  # the other parts are still counted
    assert model.memory_parts().as_mib()["gathered"] is None

    result = TrainResult(
        RunConfig(impl="torch_fsdp", world_size=1),
        [[0.01]],
        [[0.0]],
        [[4]],
        1.0,
        {},
        [[0.0]],
        [[0.0]],
        memory=[figures],
    )
    records = benchmark_rows.to_records([result])
    assert records[0]["mem_gathered_mib"] is None and records[0]["mem_peak_mib"] is None
    assert json.loads(format_records(records, "json", benchmark_rows.CSV_COLUMNS))[0]["mem_peak_mib"] is None
    table = format_records([benchmark_rows.table_row(r) for r in records], "table", ["implementation", "mem_peak_mib"])
    assert table.splitlines()[-1].split() == ["torch_fsdp", "n/a"]
    (row,) = benchmark_rows.memory_records(records)
    assert row["mem_gathered_mib"] == row["mem_peak_mib"] == row["cuda_max_allocated_mib"] == "n/a"
    assert row["mem_parameters_mib"] == pytest.approx(figures["parameters"] / 2**20, abs=1e-3)
    assert "n/a" in format_records([row], "table", benchmark_rows.MEMORY_TABLE)


def test_on_a_torch_without_fsdp2s_custom_collectives_torch_fsdp_imports_and_refuses_in_one_line_before_ranks_start(
    monkeypatch,
):
    # torch < 2.9 has no _fsdp_api.AllGather: load a second copy of torch_fsdp.py as if the import failed there
    monkeypatch.setitem(sys.modules, "torch.distributed.fsdp._fully_shard._fsdp_api", None)  # import -> ImportError
    spec = importlib.util.spec_from_file_location("torch_fsdp_on_old_torch", torch_fsdp.__file__)
    assert spec is not None and spec.loader is not None
    old = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(old)
    assert (
        old.FSDP2_MISSING == f"torch_fsdp needs torch>=2.9 (FSDP2's custom collectives), not torch {torch.__version__}"
    )
    with pytest.raises(ValueError, match=r"^torch_fsdp needs torch>=2\.9 [^\n]*$"):
        old.TorchFSDP(cases.build("toy", 0))  # no process group is needed to be told
    with pytest.raises(ValueError, match=r"^torch_fsdp needs torch>=2\.9 "):
        old.check_fsdp2_settings(None, False)  # what RunConfig calls: refused before any rank starts
    assert torch_fsdp.FSDP2_MISSING == ""  # this torch has them
