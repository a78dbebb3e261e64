"""Solver benchmark: `python benchmarks/solvers.py [--quick] [--out DIR] [--sizes ...] [--formulations ...]`.

The same as `qsync-opt bench solvers` (see `--help`): every backend (and, with
--formulations mccormick,marginal, both cast linearisations) on zoo-model and synthetic
instances. Prints the machine load and a table; writes DIR/solvers.csv (default benchmarks/results/) row by row (the
command and the load in its header comments) and DIR/solvers.png.
"""

import sys
from pathlib import Path

from qsync_opt.cli.commands import main

RESULTS = Path(__file__).resolve().parent / "results"

if __name__ == "__main__":
    args = sys.argv[1:]
    if not any(a == "--out" or a.startswith("--out=") for a in args):
        args += ["--out", str(RESULTS)]  # never the current directory
    sys.exit(main(["bench", "solvers", *args]))
