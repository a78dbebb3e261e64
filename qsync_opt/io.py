"""Atomic file writes: a reader never sees a half-written plan, checkpoint or table; and a
lock for cache entries that several processes may want to compute at once (`entry_lock`).

The temporary file mkstemp creates is private (0600); before it replaces the target it gets
the target's existing mode, or for a new file the mode `open()` would give (0666 minus the
umask), so a plan written for a team stays readable by the team.
"""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path


def _umask() -> int:
    try:  # Linux reports it without changing it (os.umask would, briefly, for every thread)
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _target_mode(path: Path) -> int:
    try:
        return stat.S_IMODE(path.stat().st_mode)
    except FileNotFoundError:
        return 0o666 & ~_umask()


def atomic_write_bytes(path: "str | Path", data: bytes) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = _target_mode(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fchmod(f.fileno(), mode)
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return path


def atomic_write_text(path: "str | Path", text: str) -> Path:
    return atomic_write_bytes(path, text.encode())


@contextmanager
def entry_lock(path: "str | Path", on_wait: "Callable[[], None] | None" = None) -> Iterator[None]:
    """Hold an exclusive lock on `<path>.lock` (other processes and threads wait for it).

    For a cache entry that is costly to compute: take the lock, look for the entry again (a
    process that held the lock before may have written it), compute and write it atomically
    only if still missing. `on_wait` is called once if another holder makes this one wait
    (to say so to the user). The lock file stays (removing it would race a waiter).
    """
    from filelock import FileLock, Timeout

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(path) + ".lock", thread_local=False, is_singleton=False)
    try:
        lock.acquire(blocking=False)
    except Timeout:
        if on_wait is not None:
            on_wait()
        lock.acquire()
    try:
        yield
    finally:
        lock.release()
