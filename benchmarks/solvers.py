"""Solver benchmark: `python benchmarks/solvers.py [--quick] [--out results]`.

Same as `qsync-opt bench solvers`; prints a table and writes results/solvers.csv and .png.
"""

import argparse
from pathlib import Path

from qsync_opt.solver.bench import run_benchmark

if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default="results")
    ap.add_argument("--quick", action="store_true", help="small models and sizes up to 1,000 ops")
    ap.add_argument("--instances", help="directory of saved problem JSON files")
    ap.add_argument("--models", help="comma-separated zoo models (default: all)")
    ap.add_argument("--sizes", help="comma-separated synthetic sizes (default 50,200,1000,5000)")
    ap.add_argument("--backends", help="comma-separated backends (default: all available)")
    ap.add_argument("--limit", type=float, default=60.0, help="time limit per solve, s")
    ap.add_argument("--gap", type=float, default=1e-3, help="relative gap (0.1%% default)")
    a = ap.parse_args()
    split = lambda s, f=str: [f(x) for x in s.split(",")] if s else None  # noqa: E731
    run_benchmark(Path(a.out), a.instances, a.quick, split(a.models), split(a.sizes, int), split(a.backends), a.limit, a.gap)
