"""`python -m qsync_opt.cli.commands ...` (and `torchrun -m qsync_opt.cli.commands train ...`): the qsync-opt command."""

import sys

from qsync_opt.cli.commands.commands import main

sys.exit(main())
