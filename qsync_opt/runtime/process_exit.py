"""Leave a process that used torch.distributed without running C++ static destructors.

After a clean `destroy_process_group`, interpreter shutdown can still destroy a joinable
gloo/c10d thread, and std::terminate then aborts the process ("terminate called without an
active exception", SIGABRT): a rank that finished its work is reported killed and its launcher
stops the others. Seen in training ranks, in the predictor harness's ranks (1 in ~40 DDP
measurements) and in the profiler's spawned all-reduce / DDP-step ranks (about 1 in 5).
Every file a caller needs must be closed before this is called.
"""

from __future__ import annotations

import os
import sys

EXIT_STOPPED = 4
"""A rank's (and `qsync-opt train`'s) exit code when a signal stopped it after checkpointing."""


def exit_without_destructors(code: int) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
