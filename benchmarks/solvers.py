"""Solver benchmark: `python benchmarks/solvers.py [--quick] [--out DIR] [--sizes ...] [--formulations ...]`.

The same as `qsync-opt bench solvers` (see `--help`): every backend (and, with
--formulations mccormick,marginal, both cast linearisations) on zoo-model and synthetic
instances. Prints the machine load and a table; writes DIR/solvers.csv row by row (the
command and the load in its header comments) and DIR/solvers.png.
"""

import sys

from qsync_opt.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", "solvers", *sys.argv[1:]]))
