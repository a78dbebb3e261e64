"""Solver benchmark: `python benchmarks/solvers.py [--quick] [--out results] [--models ...] [--sizes ...]`.

The same as `qsync-opt bench solvers` (see `--help`): every backend on zoo-model and synthetic
instances; prints a table and writes results/solvers.csv and results/solvers.png.
"""

import sys

from qsync_opt.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", "solvers", *sys.argv[1:]]))
