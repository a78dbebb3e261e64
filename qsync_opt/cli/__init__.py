"""The `qsync-opt` command line: thin verbs that parse, call a problem kind, and print.

`qsync_opt.cli:main` is the console script; the verbs live in `qsync_opt.cli.commands`."""

from qsync_opt.cli.commands import (EXIT_BAD_INPUT, EXIT_FAIL, EXIT_INFEASIBLE, EXIT_MISSES_BOUNDS, EXIT_OK,
                                    EXIT_STOPPED, main)

__all__ = ["main", "EXIT_OK", "EXIT_FAIL", "EXIT_BAD_INPUT", "EXIT_INFEASIBLE", "EXIT_STOPPED", "EXIT_MISSES_BOUNDS"]
