"""Benchmark scripts are imported by module name with benchmarks/ on sys.path (tests and scripts do this), so a
script named like an installed package shadows it for everything imported after: transformers 5.25 imports the
`kernels` package, and benchmarks/kernels.py (now kernel_speed.py) broke every Hugging Face test."""

from __future__ import annotations

import sys
from importlib.machinery import PathFinder
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def test_no_benchmark_script_is_named_like_an_installed_or_standard_module():
    path = [p for p in sys.path if Path(p or ".").resolve() != BENCH]
    clashes = []
    for script in sorted(BENCH.glob("*.py")):
        name = script.stem
        if name in sys.stdlib_module_names or name in sys.builtin_module_names:
            clashes.append(f"{script.name}: the standard library's {name!r}")
            continue
        spec = PathFinder.find_spec(name, path)
        if spec is not None and spec.origin is not None:  # a namespace package (a bare folder) never wins over a module
            clashes.append(f"{script.name}: an installed module {name!r} ({spec.origin})")
    assert not clashes, "rename these benchmark scripts: " + "; ".join(clashes)
