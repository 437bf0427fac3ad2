"""The ddp package's layout is its architecture: one module per strategy, named as the registry names it, the
helpers that are not strategies in the folders below, and each folder imports only the folders below it
(comm -> grads, memory -> sharding -> strategies; comm -> launch, optim; all -> training -> CLIs)."""

import ast
from pathlib import Path

import pytest

import ddp
from ddp.strategies import registry
from tests.support.imports import runtime_import_nodes

PACKAGE = Path(ddp.__file__).parent
# what each folder may import from the package at run time
ALLOWED = {
    "comm": {"comm"},
    "launch": {"launch", "comm"},
    "grads": {"grads", "comm"},
    "memory": {"memory", "comm"},
    "sharding": {"sharding", "grads", "comm"},
    "strategies": {"strategies", "grads", "memory", "sharding", "comm"},
    "optim": {"optim", "comm"},
    "training": {"training", "strategies", "grads", "memory", "sharding", "optim", "launch", "comm"},
}
# a strategy's module is its registry name, except where that name would shadow a package
MODULE_OF = {"torch": "torch_ddp"}


def imported_folders(path: Path) -> set[str]:
    """The ddp sub-packages a module imports (at any depth in the module, TYPE_CHECKING blocks aside)."""
    names = []
    for node in runtime_import_nodes(path):
        if isinstance(node, ast.ImportFrom) and node.module:
            names += [node.module] if node.module != "ddp" else [f"ddp.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names += [a.name for a in node.names]
    folders = {n.split(".")[1] for n in names if n.startswith("ddp.")}
    return folders & set(ALLOWED) | ({"top"} if folders - set(ALLOWED) else set())


@pytest.mark.parametrize("folder", sorted(ALLOWED))
def test_each_folder_imports_only_the_folders_below_it(folder):
    wrong = {
        path.name: sorted(imported_folders(path) - ALLOWED[folder]) for path in sorted((PACKAGE / folder).glob("*.py"))
    }
    assert {k: v for k, v in wrong.items() if v} == {}


def test_the_layering_check_sees_a_wrong_import(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("from ddp.comm import inflight\ndef f():\n    from ddp import cli\n")
    assert imported_folders(module) == {"comm", "top"}


@pytest.mark.parametrize("name", list(registry.IMPLEMENTATIONS))
def test_each_strategy_has_its_own_module_named_as_the_registry_names_it(name):
    cls = registry.get(name)
    assert cls.__module__ == f"ddp.strategies.{MODULE_OF.get(name, name)}"
    # class names match: overlap_bucket -> OverlapBucketDDP, fsdp -> FSDP, torch_fsdp -> TorchFSDP
    expected = name.replace("_", "") + ("" if name.endswith(("fsdp", "hsdp")) else "ddp")
    assert cls.__name__.lower() == expected
    assert getattr(ddp, cls.__name__) is cls


def test_strategies_holds_the_strategies_their_base_and_the_registry_only():
    """Helpers that are not strategies (flags, buckets, units, memory accounting) live in the folders below."""
    modules = {path.stem for path in (PACKAGE / "strategies").glob("*.py")}
    strategies = {MODULE_OF.get(name, name) for name in registry.IMPLEMENTATIONS}
    assert modules - strategies == {"__init__", "base", "registry"}
