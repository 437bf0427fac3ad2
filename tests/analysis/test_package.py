"""The package as a newcomer meets it: the public names of `analysis` resolve, each folder imports
only the folders below it (trace -> measure -> run -> the features; session.py, cli.py and the
commands on top),
and the top-level packages import only those below them (contract <- ddp, analysis; profiling glues ddp)."""

import ast
import os
import sys
from pathlib import Path

import pytest

import analysis
from tests.support.imports import runtime_import_nodes

PACKAGE = Path(analysis.__file__).parent
# what each folder may import from the package, sub-folders included (type-only imports under
# `if TYPE_CHECKING:` aside): the trace core, then the measure core, then each feature, report on top.
# errors.py and options.py are below all; session.py and cli.py above all: only the entry modules (each
# feature's command, and advise's Python API advise(), which opens its runs through api.open_runs)
# import them.
ALLOWED = {
    "trace": {"trace"},
    "cache": {"cache", "trace"},
    "measure": {"measure", "trace"},
    "run": {"run", "cache", "measure", "trace"},
    "render": {"render"},
    "fsdp_units": {"fsdp_units", "measure", "trace", "render"},
    "collectives": {"collectives", "fsdp_units", "run", "cache", "measure", "trace", "render"},
    "overlap": {"overlap", "collectives", "run", "cache", "measure", "trace", "render"},
    "timeline": {"timeline", "overlap", "run", "measure", "trace", "render"},
    "parallel": {"parallel", "overlap", "collectives", "run", "measure", "trace"},
    "advise": {"advise", "overlap", "fsdp_units", "run", "cache", "measure", "trace", "render"},
    "report": {
        "report", "timeline", "overlap", "collectives", "fsdp_units", "parallel", "run", "measure", "trace",
        "render",
    },
}  # fmt: skip
TOP = {"session", "api", "cli"}  # the API and the CLIs' shared plumbing (the package root): the commands' only
ENTRIES = {"command.py", "gate_command.py", "__main__.py", "advise/advice.py"}  # file names, or paths
ROOT_ALLOWED = {"errors.py": set(), "options.py": {"trace"}}  # the root's two modules below every folder

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
    module.write_text(
        "import os\ndef f():\n    from analysis.trace.readers import nsys_export\nimport contract.names\n"
    )
    assert {n.split(".")[0] for n in imported_modules(module)} & set(PACKAGES) - PACKAGES["profiling"] == {"analysis"}


def imported_stages(path: Path) -> set[str]:
    """The analysis folders (and top modules session, cli) a module imports at run time (any depth, not
    under TYPE_CHECKING)."""
    names = []
    for node in runtime_import_nodes(path):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)
            if node.module == "analysis":
                names += [f"analysis.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names += [a.name for a in node.names]
    return {n.split(".")[1] for n in names if n.startswith("analysis.")} & (set(ALLOWED) | TOP)


def rel(path: Path) -> str:
    return str(path.relative_to(PACKAGE))


@pytest.mark.parametrize("stage", sorted(ALLOWED))
def test_each_stage_imports_only_the_stages_before_it(stage):
    """A folder's modules import only the folders below it; its entry modules also the API and the CLI plumbing."""
    wrong = {
        str(path.relative_to(PACKAGE)): sorted(
            imported_stages(path) - ALLOWED[stage] - (TOP if ENTRIES & {path.name, rel(path)} else set())
        )
        for path in sorted((PACKAGE / stage).rglob("*.py"))
    }
    assert {k: v for k, v in wrong.items() if v} == {}


def test_the_root_modules_below_every_folder_import_no_folder_above_them():
    wrong = {name: sorted(imported_stages(PACKAGE / name) - allowed) for name, allowed in ROOT_ALLOWED.items()}
    assert {k: v for k, v in wrong.items() if v} == {}


def test_every_folder_is_a_checked_stage():
    folders = {p.parent.relative_to(PACKAGE).parts[0] for p in PACKAGE.rglob("*.py") if p.parent != PACKAGE}
    assert folders - {"__pycache__"} == set(ALLOWED)


def test_the_layering_check_sees_a_wrong_import(tmp_path):
    module = tmp_path / "m.py"
    module.write_text(
        "from typing import TYPE_CHECKING\nfrom analysis.measure import intervals\nfrom analysis import cli\n"
        "if TYPE_CHECKING:\n    from analysis.overlap.analyze import Analysis\n"
        "def f():\n    from analysis.render.table import format_table\n"
    )
    assert imported_stages(module) == {"measure", "render", "cli"}


def test_every_public_name_resolves():
    for name in analysis.__all__:
        assert getattr(analysis, name) is not None, name


def test_load_trace_classifies_communication(tmp_path):
    from tests.support.synthetic_ddp import write_ddp_trace

    trace = analysis.load_trace(write_ddp_trace(tmp_path / "t.sqlite", 400, 2, 1, 2))
    names = trace.gpu_ops["name"].astype(str)
    assert trace.gpu_ops["is_comm"].to_numpy().tolist() == names.str.startswith("nccl").tolist()
    assert trace.gpu_ops["is_comm"].any() and not trace.gpu_ops["is_comm"].all()


def runtime_imports(path: Path, typing_too: bool = False) -> set[str]:
    """The analysis modules a module imports at run time, deferred imports inside functions included
    (with typing_too, the imports under `if TYPE_CHECKING:` too): `from analysis.x import y` counts
    analysis.x.y when that is a module, else analysis.x; relative imports count as the absolute ones."""
    nodes = all_import_nodes(path) if typing_too else runtime_import_nodes(path)
    package = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1])
    found = set()
    for node in nodes:
        if isinstance(node, ast.ImportFrom):
            module = _absolute(node, package)
            if not module.startswith("analysis"):
                continue
            for alias in node.names:
                sub = f"{module}.{alias.name}"
                found.add(sub if _module_path(sub) else module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("analysis")}
    return {m for m in found if _module_path(m)}


def all_import_nodes(path: Path) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement in the file, at any depth, under TYPE_CHECKING or not."""
    return [n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, (ast.Import, ast.ImportFrom))]


def _absolute(node: ast.ImportFrom, package: str) -> str:
    """The absolute module name of `from X import ...` in `package` (`from .x` and `from ..x` resolved)."""
    if not node.level:
        return node.module or ""
    base = package.split(".")[: len(package.split(".")) - node.level + 1]
    return ".".join([*base, node.module] if node.module else base)


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


def package_graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    """Module -> the package's modules it imports, at run time, deferred or for type checking only."""
    modules = {}
    for path in sorted(root.rglob("*.py")):
        name = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        modules[name.removesuffix(".__init__")] = runtime_imports(path, typing_too=True)
    modules.pop("analysis", None)  # the package's lazy names: it imports nothing at run time
    return {m: {d for d in deps if d != "analysis"} for m, deps in modules.items()}


def test_no_module_of_the_package_imports_itself_back():
    """No import cycle anywhere in analysis/, deferred imports and imports for type
    checking only counted too: a module that needs a function-level import or an `if TYPE_CHECKING:`
    to avoid a cycle is in the wrong place (the shared piece belongs a layer below both)."""
    assert import_cycles(package_graph()) == []


def test_the_cycle_check_sees_a_deferred_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert import_cycles(graph) == [["a", "b", "c", "a"]]
    assert import_cycles({"a": {"b"}, "b": set()}) == []


def test_the_cycle_check_counts_deferred_typing_and_relative_imports(tmp_path, monkeypatch):
    """A cycle closed by an import inside a function, one closed by a TYPE_CHECKING import and one closed
    by a relative import are each found in a package laid out like analysis/."""
    root = tmp_path / "analysis"
    (root / "sub").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "sub" / "__init__.py").write_text("")
    (root / "sub" / "a.py").write_text("from analysis.sub import b\n")
    (root / "sub" / "b.py").write_text("def f():\n    from analysis.sub.a import x\n")
    (root / "sub" / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from analysis.sub.d import D\n"
    )
    (root / "sub" / "d.py").write_text("from analysis.sub import c\n")
    (root / "sub" / "e.py").write_text("from .f import g\n")
    (root / "sub" / "f.py").write_text("from ..sub import e\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", root)
    graph = package_graph(root)
    assert graph["analysis.sub.b"] == {"analysis.sub.a"} and graph["analysis.sub.c"] == {"analysis.sub.d"}
    assert graph["analysis.sub.e"] == {"analysis.sub.f"} and graph["analysis.sub.f"] == {"analysis.sub.e"}
    assert sorted(map(tuple, import_cycles(graph))) == [
        ("analysis.sub.a", "analysis.sub.b", "analysis.sub.a"),
        ("analysis.sub.c", "analysis.sub.d", "analysis.sub.c"),
        ("analysis.sub.e", "analysis.sub.f", "analysis.sub.e"),
    ]


# Run in a fresh interpreter: imports `analysis`, touches every public name (importing its module) and
# every command's modules without running them, and prints what the process looked like before and after.
# An audit hook sees every symbol looked up through ctypes (a mallopt or malloc_trim call needs one).
IMPORT_EVERYTHING = """
import gc, importlib.util, json, os, pkgutil, sys
symbols = []
sys.addaudithook(lambda event, args: symbols.append(str(args[1])) if event == "ctypes.dlsym" else None)
def state():
    return {"environ": dict(os.environ), "gc": [gc.isenabled(), gc.get_threshold(), gc.get_freeze_count()]}
before = state()
import analysis
for name in analysis.__all__:
    getattr(analysis, name)
commands = [m.name for m in pkgutil.iter_modules(analysis.__path__, "analysis.") if m.ispkg]
for package in ["analysis", *commands]:
    for module in ("__main__", "command", "cli", "api", "session"):
        if importlib.util.find_spec(package) and importlib.util.find_spec(f"{package}.{module}"):
            importlib.import_module(f"{package}.{module}")
print(json.dumps({"before": before, "after": state(), "symbols": symbols, "modules": sorted(sys.modules)}))
"""


def _import_everything(cwd: Path, env: dict) -> dict:
    """What IMPORT_EVERYTHING reports from a fresh interpreter started in `cwd` with `env`."""
    import json
    import subprocess

    got = subprocess.run(
        [sys.executable, "-c", IMPORT_EVERYTHING],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return json.loads(got.stdout)


def test_importing_the_package_leaves_the_process_as_it_was():
    """The environment, the garbage collector (enabled, thresholds, nothing frozen) and the allocator (no
    ARROW_* or MALLOC_* setting, no mallopt or malloc_trim) are the same after importing `analysis`, its
    public names' modules and every command's modules as before."""

    env = {k: v for k, v in os.environ.items() if not k.startswith(("ARROW_", "MALLOC_"))}
    seen = _import_everything(PACKAGE.parent, env)
    assert {"analysis.api", "analysis.session", "analysis.overlap.command", "analysis.report.__main__"} <= set(
        seen["modules"]
    )  # the modules were imported, not only the package
    assert seen["after"]["environ"] == seen["before"]["environ"]
    assert seen["after"]["gc"] == seen["before"]["gc"]
    assert not [s for s in seen["symbols"] if s.startswith(("malloc", "mallopt"))], seen["symbols"]


def test_the_purity_check_sees_a_changed_process(tmp_path):
    """The same check, on a stand-in `analysis` that sets the environment, freezes gc and trims the heap."""

    fake = tmp_path / "analysis"
    fake.mkdir()
    (fake / "__init__.py").write_text(
        "import ctypes, gc, os\n__all__ = []\nos.environ['ARROW_DEFAULT_MEMORY_POOL'] = 'system'\ngc.freeze()\n"
        "ctypes.CDLL('libc.so.6').malloc_trim(0)\n"
    )
    seen = _import_everything(tmp_path, {**os.environ, "PYTHONPATH": str(tmp_path)})
    assert seen["after"]["environ"]["ARROW_DEFAULT_MEMORY_POOL"] == "system"
    assert seen["after"]["gc"][2] > seen["before"]["gc"][2]
    assert "malloc_trim" in seen["symbols"]
