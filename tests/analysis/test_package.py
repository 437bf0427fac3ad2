"""The package as a newcomer meets it: the public names of `analysis` resolve, each stage folder
imports only the stages before it (readers -> frames -> measures -> views; engine and the CLIs on top),
and the top-level packages import only those below them (contract <- ddp, analysis; profiling glues ddp)."""

import ast
from pathlib import Path

import pytest

import analysis
from tests.support.imports import runtime_import_nodes

PACKAGE = Path(analysis.__file__).parent
# what each folder may import from the package (type-only imports under `if TYPE_CHECKING:` aside)
ALLOWED = {
    "frames": {"frames"},
    "readers": {"readers", "frames"},
    "measures": {"measures", "frames"},
    "views": {"views", "measures", "frames"},
    "engine": {"engine", "views", "measures", "readers", "frames"},
}

# what each top-level package may import from the repository (contract is below all; analysis never
# imports ddp or profiling, so recording never loads pandas; profiling glues ddp to the recording)
PACKAGES = {
    "contract": {"contract"},
    "ddp": {"ddp", "contract"},
    "analysis": {"analysis", "contract"},
    "profiling": {"profiling", "ddp", "contract"},
}


def imported_modules(path: Path) -> list[str]:
    """Every module name a file imports, at any depth, in or out of TYPE_CHECKING."""
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
        elif isinstance(node, ast.Import):
            names += [a.name for a in node.names]
    return names


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_each_package_imports_only_the_packages_below_it(package):
    wrong = {
        str(path.relative_to(PACKAGE.parent)): sorted(
            {n.split(".")[0] for n in imported_modules(path)} & set(PACKAGES) - PACKAGES[package]
        )
        for path in sorted((PACKAGE.parent / package).rglob("*.py"))
    }
    assert {k: v for k, v in wrong.items() if v} == {}


def test_the_package_check_sees_profiling_import_analysis(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("import os\ndef f():\n    from analysis.readers import nsys_export\nimport contract.names\n")
    assert {n.split(".")[0] for n in imported_modules(module)} & set(PACKAGES) - PACKAGES["profiling"] == {"analysis"}


def imported_stages(path: Path) -> set[str]:
    """The analysis sub-packages a module imports at run time (any depth, not under TYPE_CHECKING)."""
    names = []
    for node in runtime_import_nodes(path):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)
        elif isinstance(node, ast.Import):
            names += [a.name for a in node.names]
    return {n.split(".")[1] for n in names if n.startswith("analysis.") and n.count(".") >= 1} & set(ALLOWED)


@pytest.mark.parametrize("stage", sorted(ALLOWED))
def test_each_stage_imports_only_the_stages_before_it(stage):
    wrong = {
        str(path.relative_to(PACKAGE)): sorted(imported_stages(path) - ALLOWED[stage])
        for path in sorted((PACKAGE / stage).glob("*.py"))
    }
    assert {k: v for k, v in wrong.items() if v} == {}


def test_the_layering_check_sees_a_wrong_import(tmp_path):
    module = tmp_path / "m.py"
    module.write_text(
        "from typing import TYPE_CHECKING\nfrom analysis.measures import intervals\n"
        "if TYPE_CHECKING:\n    from analysis.engine.analyze import Analysis\n"
        "def f():\n    from analysis.views.table import format_table\n"
    )
    assert imported_stages(module) == {"measures", "views"}


def test_every_public_name_resolves():
    for name in analysis.__all__:
        assert getattr(analysis, name) is not None, name


def test_load_trace_classifies_communication(tmp_path):
    from tests.support.synthetic_ddp import write_ddp_trace

    trace = analysis.load_trace(write_ddp_trace(tmp_path / "t.sqlite", 400, 2, 1, 2))
    names = trace.gpu_ops["name"].astype(str)
    assert trace.gpu_ops["is_comm"].to_numpy().tolist() == names.str.startswith("nccl").tolist()
    assert trace.gpu_ops["is_comm"].any() and not trace.gpu_ops["is_comm"].all()


def runtime_imports(path: Path) -> set[str]:
    """The analysis modules a module imports at run time, deferred imports inside functions included
    (TYPE_CHECKING-only imports aside): `from analysis.x import y` counts analysis.x.y when that is a
    module, else analysis.x."""
    found = set()
    for node in runtime_import_nodes(path):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("analysis"):
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if _module_path(sub) else node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("analysis")}
    return {m for m in found if _module_path(m)}


def _module_path(name: str) -> Path | None:
    base = PACKAGE.parent / Path(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every cycle found by a depth-first walk of the graph, each as the modules along it."""
    cycles, state, stack = [], {}, []

    def visit(node: str) -> None:
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                cycles.append([*stack[stack.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return cycles


def package_graph() -> dict[str, set[str]]:
    modules = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        modules[name.removesuffix(".__init__")] = runtime_imports(path)
    modules.pop("analysis", None)  # the package's lazy names: it imports nothing at run time
    return {m: {d for d in deps if d != "analysis"} for m, deps in modules.items()}


def test_no_module_of_the_package_imports_itself_back():
    """No import cycle anywhere in analysis/, engine/ included, deferred imports counted too: a
    module that needs a function-level import to avoid a cycle is in the wrong place."""
    assert import_cycles(package_graph()) == []


def test_the_cycle_check_sees_a_deferred_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert import_cycles(graph) == [["a", "b", "c", "a"]]
    assert import_cycles({"a": {"b"}, "b": set()}) == []
