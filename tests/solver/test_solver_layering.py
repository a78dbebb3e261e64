"""solver/ imports only downward: never pipeline, predictor, runtime or the CLI (DESIGN.md layout)."""

from __future__ import annotations

import ast
from pathlib import Path

import qsync_opt.solver

FORBIDDEN = ("pipeline", "predictor", "runtime", "cli", "batch_split", "bench_solvers", "refine")


def _imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against the file's package
                pkg = path.relative_to(Path(qsync_opt.solver.__file__).parents[1]).parent.parts
                base = ".".join(("qsync_opt", *pkg[: len(pkg) - node.level + 1], *([base] if base else [])))
            out.append(base)
    return out


def test_solver_imports_nothing_above_it():
    root = Path(qsync_opt.solver.__file__).parent
    bad = []
    for path in sorted(root.rglob("*.py")):
        for mod in _imports(path):
            parts = mod.split(".")
            if parts[0] == "qsync_opt" and len(parts) > 1 and parts[1] in FORBIDDEN:
                bad.append(f"{path.relative_to(root)} imports {mod}")
    assert not bad, "\n".join(bad)
