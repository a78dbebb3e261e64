"""Solver benchmark: `python benchmarks/solvers.py [--quick | --smoke] [--out DIR] [--sizes ...] [--formulations ...]`.

The same as `qsync-opt bench solvers` (see `--help`): every backend (and, with
--formulations mccormick,marginal, both cast linearisations) on zoo-model and synthetic
instances. Prints the machine load and a table; writes DIR/solvers.csv (default benchmarks/results/) row by row (the
command and the load in its header comments) and DIR/solvers.png. `--smoke` (tests) is the smallest run of that
path: one synthetic 50-op chain with HiGHS, no zoo model; it needs --out.
"""

import sys
from pathlib import Path

from qsync_opt.cli.commands import main

RESULTS = Path(__file__).resolve().parent / "results"
SMOKE = ["--models", "none", "--sizes", "50", "--kinds", "chain", "--backends", "highs", "--limit", "5"]

if __name__ == "__main__":
    args = sys.argv[1:]
    has_out = any(a == "--out" or a.startswith("--out=") for a in args)
    if "--smoke" in args:
        if not has_out:
            print("solvers.py: error: --smoke needs --out DIR: a smoke run never writes benchmarks/results",
                  file=sys.stderr)
            sys.exit(2)
        args = [a for a in args if a != "--smoke"] + SMOKE
    if not has_out:
        args += ["--out", str(RESULTS)]  # never the current directory
    sys.exit(main(["bench", "solvers", *args]))
