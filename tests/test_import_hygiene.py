"""Modules meet through public names, and the package is imported at module top: an import of qsync_opt inside a
function is the exception, kept for an import cost or an optional extra, and says which in a comment."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "qsync_opt"
MAX_DEFERRED = 80
"""The most imports of the package inside functions (the kinds issue's bound)."""


def _package_imports(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("qsync_opt") or isinstance(node, ast.Import) and any(a.name.startswith("qsync_opt") for a in node.names):
            yield node


def _files():
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path, path.read_text()


def test_no_private_name_is_imported_from_another_module():
    found = [f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.module}.{alias.name}"
             for path, text in _files() for node in _package_imports(ast.parse(text))
             if isinstance(node, ast.ImportFrom)
             for alias in node.names if alias.name.startswith("_") and not alias.name.startswith("__")]
    assert found == []


def test_imports_inside_functions_are_few_and_each_says_why():
    deferred, silent = [], []
    for path, text in _files():
        lines, tree = text.splitlines(), ast.parse(text)
        inside = {id(sub) for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                  for sub in ast.walk(node)}
        for node in _package_imports(tree):
            if id(node) not in inside:
                continue
            where = f"{path.relative_to(PACKAGE.parent)}:{node.lineno}"
            deferred.append(where)
            own = " ".join(lines[node.lineno - 1:node.end_lineno])
            if "#" not in own and not lines[node.lineno - 2].strip().startswith("#"):
                silent.append(where)
    assert len(deferred) <= MAX_DEFERRED, f"{len(deferred)} imports of the package inside functions"
    assert silent == [], "say why each stays inside its function (e.g. `# import cost: torch`)"
