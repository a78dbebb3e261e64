"""The `qsync-opt` command line: thin verbs that parse, call a problem kind, and print.

`qsync_opt.cli:console` is the console script, `main(argv)` the same verbs returning their exit code
(in-process callers); the verbs live in `qsync_opt.cli.commands`."""

from qsync_opt.cli.commands import (EXIT_BAD_INPUT, EXIT_FAIL, EXIT_INFEASIBLE, EXIT_MISSES_BOUNDS, EXIT_OK,
                                    EXIT_STOPPED, console, main)

__all__ = ["main", "console", "EXIT_OK", "EXIT_FAIL", "EXIT_BAD_INPUT", "EXIT_INFEASIBLE", "EXIT_STOPPED", "EXIT_MISSES_BOUNDS"]
