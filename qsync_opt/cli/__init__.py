"""The `qsync-opt` command line: thin verbs that parse, call a problem kind, and print."""

from qsync_opt.cli.main import main

__all__ = ["main"]
