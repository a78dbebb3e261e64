"""How a process ends: on a stop (SIGTERM/SIGINT), and without C++ static destructors.

`stop_on_signals` turns SIGTERM and SIGINT into a `Stopped` exception in the main thread, so
that a stop during any work done in-process (loading a spec, preparing data, profiling,
solving, writing a report) unwinds like an exception and ends the command with EXIT_STOPPED.
`Stopped` derives from BaseException: the `except Exception` that turns a user's failing
Dataset or model into a bad-input message never swallows a stop.

`exit_without_destructors`: leave a process that used torch.distributed without running C++
static destructors.

After a clean `destroy_process_group`, interpreter shutdown can still destroy a joinable
gloo/c10d thread, and std::terminate then aborts the process ("terminate called without an
active exception", SIGABRT): a rank that finished its work is reported killed and its launcher
stops the others. Seen in training ranks, in the predictor harness's ranks and in the
profiler's spawned all-reduce / DDP-step ranks (docs/run.md has how often).
Every file a caller needs must be closed before this is called.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator

EXIT_STOPPED = 4
"""A rank's (and `qsync-opt train`'s) exit code when a signal stopped it after checkpointing."""


class Stopped(BaseException):
    """A SIGTERM/SIGINT asked the command to stop; `signal` is the signal's name.

    `where` says what was under way (a stage, "before any rank started"), `detail` what was
    kept and how to continue; str() is the one-line message a user sees."""

    def __init__(self, signal: str, where: str | None = None, detail: str | None = None):
        super().__init__(signal)
        self.signal, self.where, self.detail = signal, where, detail

    def __str__(self) -> str:
        return (f"stopped by {self.signal}" + (f" {self.where}" if self.where else "")
                + (f"; {self.detail}" if self.detail else ""))


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """While the block runs, SIGTERM and SIGINT raise `Stopped` in the main thread.

    Handlers installed inside the block (spawn_ranks forwards a stop to its ranks) take over
    until they restore this one. Off the main thread (where no handler can be installed) it
    does nothing. The previous handlers are restored on leaving."""
    def stop(signum, frame):
        raise Stopped(signal.Signals(signum).name)

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def exit_without_destructors(code: int) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
