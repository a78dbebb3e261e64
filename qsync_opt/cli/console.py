"""Consoles for the CLI's output."""

from rich.console import Console


def console(stderr: bool = False) -> Console:
    """A console that stays readable when piped (rich would shrink tables to 80 columns)."""
    probe = Console(stderr=stderr)
    return probe if probe.is_terminal else Console(stderr=stderr, width=160)
