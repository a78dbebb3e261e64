"""`python -m qsync_opt.cli ...` (and `torchrun -m qsync_opt.cli train ...`): the qsync-opt command."""

import sys

from qsync_opt.cli.commands import main

sys.exit(main())
