"""`python -m qsync_opt.cli ...` (and `torchrun -m qsync_opt.cli train ...`): the qsync-opt command."""

from qsync_opt.cli.commands import console

console()
