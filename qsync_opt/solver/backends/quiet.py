"""Keep solver libraries' C-level chatter off stdout, where `solve --json` writes the plan.

HiGHS prints a two-line banner on the first `Highs()` of a process, from C++ straight to
file descriptor 1, whatever `output_flag` says; Python's sys.stdout redirection cannot catch it.
"""

from __future__ import annotations

import os
import sys
import threading
from contextlib import contextmanager

_highs_banner_done = False
_highs_banner_lock = threading.Lock()
"""fd 1 is process-wide: two threads redirecting it at once could leave it on /dev/null for good."""


@contextmanager
def fd1_redirected(target_fd: int | None = None):
    """Point file descriptor 1 at `target_fd` (default /dev/null) for the duration."""
    sys.stdout.flush()
    saved = os.dup(1)
    devnull = None
    if target_fd is None:
        devnull = os.open(os.devnull, os.O_WRONLY)
        target_fd = devnull
    try:
        os.dup2(target_fd, 1)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)
        if devnull is not None:
            os.close(devnull)


def swallow_highs_banner() -> None:
    """Create (and drop) the process's first Highs object with stdout pointed at /dev/null."""
    global _highs_banner_done
    if _highs_banner_done:
        return
    import highspy

    with _highs_banner_lock:
        if not _highs_banner_done:
            with fd1_redirected():
                highspy.Highs()
            _highs_banner_done = True
