"""The import statements a module runs: for the layering tests of analysis/ and ddp/."""

from __future__ import annotations

import ast
from pathlib import Path


def runtime_import_nodes(path: Path) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement in the file at any depth (deferred imports inside functions included),
    except those under an `if TYPE_CHECKING:` block, which never run."""
    tree = ast.parse(path.read_text())
    typing_only = {
        id(node)
        for branch in ast.walk(tree)
        if isinstance(branch, ast.If) and ast.unparse(branch.test).endswith("TYPE_CHECKING")
        for stmt in branch.body
        for node in ast.walk(stmt)
    }
    return [
        node
        for node in ast.walk(tree)
        if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in typing_only
    ]
