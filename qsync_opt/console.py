"""The consoles everything qsync-opt prints through: text is never read as rich markup, and
output that is not a terminal (a file, a pipe) is never cut to 80 columns.

rich parses "[...]" in any string it prints as markup, so an install hint such as
`pip install 'qsync-opt[data]'` printed as `pip install 'qsync-opt'`. Here markup is off on
the console itself (plain strings and table cells alike); styling, where wanted, is explicit
(`styled`), never parsed out of a message.
"""

from __future__ import annotations

from rich.console import Console
from rich.text import Text

PIPE_WIDTH = 1000
"""Columns when stdout/stderr is not a terminal: wide enough that no table is shrunk or cut."""


class _Console(Console):
    def on_broken_pipe(self) -> None:
        """The reader went away (`qsync-opt solve job.yaml | head`): what it read is all it
        wanted, so the command is not failed for it. rich's default exits 1 from inside print;
        here the rest of the output goes to /dev/null as there and BrokenPipeError reaches the
        command line, which exits 0 (cli/commands.py)."""
        try:
            super().on_broken_pipe()
        except SystemExit:
            raise BrokenPipeError("the reader of this output closed it") from None


def make_console(stderr: bool = False) -> Console:
    """A console for user-facing output: markup and highlighting off; full width when piped."""
    probe = Console(stderr=stderr)
    width = None if probe.is_terminal else PIPE_WIDTH
    return _Console(stderr=stderr, markup=False, highlight=False, width=width)


def styled(label: str, style: str, message: str = "") -> Text:
    """`label` in `style`, then `message` verbatim (brackets and all)."""
    return Text.assemble((label, style), (" " + message) if message else "")
