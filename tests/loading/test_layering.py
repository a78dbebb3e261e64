"""loading/ is a shared layer below the problem kinds: it imports errors/io/precision, spec
helpers, solver (problem IR and backends), hardware, models, data and runtime, never a kind
(the training planner, pipeline, plan, predictor, serving) or the CLI."""

from __future__ import annotations

import ast
from pathlib import Path

import qsync_opt.loading

ALLOWED = {"errors", "io", "precision", "importing", "spec_base", "spec_errors", "spec_yaml", "spec", "solver",
           "hardware", "models", "data", "runtime", "loading", "kernels"}
FORBIDDEN_SOLVER = {"training", "instance", "greedy", "qsync_greedy", "uniform", "brute", "random_instances",
                    "bounded", "decompose", "lexicographic", "diagnose", "solve", "lagrange", "serving",
                    "serving_baselines", "serving_bounds"}


def _imports(path: Path) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.extend(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.append(node.module)
    return out


def test_loading_imports_only_shared_layers():
    root = Path(qsync_opt.loading.__file__).parent
    bad = []
    for path in sorted(root.rglob("*.py")):
        for mod in _imports(path):
            parts = mod.split(".")
            if parts[0] != "qsync_opt" or len(parts) < 2:
                continue
            if parts[1] not in ALLOWED or (parts[1] == "spec" and len(parts) == 2) or (
                    parts[1] == "runtime" and parts[2:3] == ["trainer"]) or (
                    parts[1] == "solver" and len(parts) > 2 and parts[2] in FORBIDDEN_SOLVER):
                bad.append(f"{path.name} imports {mod}")
    assert not bad, "\n".join(bad)
