"""Run one process per rank and watch them all, so that no failure can leave the job hanging.

A rank that dies (any exit code but 0 and EXIT_STOPPED, or a signal) ends the job within
seconds: the others get SIGTERM, then SIGKILL, since a rank blocked in a collective on a dead
peer would otherwise wait for ever. The launcher's message names the rank, its group, how it
ended and the tail of its stderr, which is passed through live and kept for that message.
"""

from __future__ import annotations

import collections
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from qsync_opt.runtime.process_exit import EXIT_STOPPED


def free_port() -> int:
    """A TCP port free on this host now (for a rendezvous the caller starts next)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Spawned:
    """How the ranks ended: exit codes and, when the job was cut short, which rank and why."""

    codes: list[int]
    failure: str | None = None
    """One paragraph naming the rank, its group, what happened and the tail of its stderr."""
    failed_code: int | None = None
    """Exit code of the rank that failed first (None: no rank failed)."""
    wall_s: float = 0.0
    signalled: bool = False
    """The launcher was asked to stop (SIGTERM/SIGINT) and passed it on to the ranks."""
    stop_signal: str | None = None
    """The name of the first signal that asked for that stop (SIGTERM, SIGINT)."""
    killed_after_grace: bool = False
    """After a stop, some rank had not ended within grace_s and was killed (its step not saved)."""


def spawn_ranks(argv: list[str], envs: list[dict[str, str]], *, timeout_s: float | None = None,
                grace_s: float = 30.0, start_timeout_s: float | None = None, kill_after_s: float = 3.0,
                stdout: int | None = None) -> Spawned:
    """Run `argv` once per environment and watch every rank until all have ended.

    When any rank exits with a code other than 0 or EXIT_STOPPED, or the ranks are not all past
    the rendezvous within `start_timeout_s` (each touches its QSYNC_READY_FILE), or the job
    outlives `timeout_s`, the others get SIGTERM and, `kill_after_s` later, SIGKILL: a rank
    blocked in a collective on a dead peer never holds the job. SIGTERM/SIGINT to the launcher
    are forwarded to every rank, which finish their step, checkpoint and exit; ranks that do
    not exit within `grace_s` are killed. `stdout` (a file descriptor) redirects the ranks' logs,
    e.g. to 2 when the launcher's own stdout must carry JSON alone.
    """
    t0 = time.monotonic()
    procs = [subprocess.Popen(argv, env=env, stdout=stdout, stderr=subprocess.PIPE) for env in envs]
    tails = [collections.deque(maxlen=STDERR_TAIL) for _ in procs]
    pumps = [threading.Thread(target=_pump, args=(p.stderr, t), daemon=True) for p, t in zip(procs, tails)]
    for t in pumps:
        t.start()
    forwarded, killed, names = [], [], []

    def forward(signum, frame):
        forwarded.append(time.monotonic())
        names.append(signal.Signals(signum).name)
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)

    old = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    failure = failed_code = None
    try:
        while [p.poll() for p in procs].count(None):  # poll every rank: any() would stop at the first alive one
            # after a forwarded stop, a rank that had not yet installed its handler ends by SIGTERM: not a failure
            fine = (None, 0, EXIT_STOPPED, -signal.SIGTERM) if forwarded else (None, 0, EXIT_STOPPED)
            bad = next((r for r, p in enumerate(procs) if p.returncode not in fine), None)
            waited = time.monotonic() - t0
            if bad is not None:
                failed_code = procs[bad].returncode
                failure = _describe_exit(bad, envs[bad], failed_code, waited)
            elif start_timeout_s is not None and waited > start_timeout_s:
                late = [r for r, e in enumerate(envs) if procs[r].poll() is None and not _ready(e)]
                if late:
                    failed_code = 1
                    bad = late[0]
                    failure = (f"{_who(late[0], envs[late[0]])} (and {len(late) - 1} more) " if len(late) > 1 else
                               f"{_who(late[0], envs[late[0]])} ")
                    failure += (f"did not get past start-up and the rendezvous within {start_timeout_s:g} s "
                                "(start_timeout_s / --start-timeout)")
            if failure is None and timeout_s is not None and waited > timeout_s:
                failed_code, failure = 1, f"the job ran past timeout_s={timeout_s:g} s"
            if failure is not None:
                _terminate(procs, kill_after_s)
                break
            if forwarded and time.monotonic() - forwarded[0] > grace_s:
                killed.append(time.monotonic())
                _terminate(procs, 0.0)  # they had grace_s to finish the step and checkpoint
                break
            time.sleep(0.05)
        codes = [p.wait() for p in procs]
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        for p in procs:
            if p.poll() is None:
                p.kill()
    for t in pumps:
        t.join(timeout=2.0)
    if failure is not None and bad is not None:
        tail = [line.rstrip() for line in tails[bad] if line.strip()]
        failure += ("; stopped the other ranks. Last lines of its stderr:\n    " + "\n    ".join(tail)
                    if tail else "; stopped the other ranks (its stderr was empty)")
    elif failure is not None:
        failure += "; stopped every rank"
    return Spawned(codes, failure, failed_code, time.monotonic() - t0, signalled=bool(forwarded),
                   stop_signal=names[0] if names else None, killed_after_grace=bool(killed))


STDERR_TAIL = 15
"""Lines of a failed rank's stderr repeated in the launcher's message."""


def _pump(stream, tail) -> None:
    """Copy a rank's stderr through, keeping its last lines for the failure message."""
    for raw in iter(stream.readline, b""):
        line = raw.decode(errors="replace")
        tail.append(line)
        try:
            sys.stderr.write(line)
            sys.stderr.flush()
        except (ValueError, OSError):  # our stderr closed (pipe to a finished reader)
            pass
    stream.close()


def _who(rank: int, env: dict) -> str:
    return f"rank {rank} (group {env.get('QSYNC_GROUP', '?')})"


def _ready(env: dict) -> bool:
    f = env.get("QSYNC_READY_FILE")
    return f is None or Path(f).exists()


def _describe_exit(rank: int, env: dict, code: int, after_s: float) -> str:
    how = (f"was killed by {signal.Signals(-code).name}" if code < 0 and -code in signal.valid_signals()
           else f"exited with code {code}")
    return f"{_who(rank, env)} {how} after {after_s:.1f} s"


def _terminate(procs, grace_s):
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    end = time.monotonic() + grace_s
    for p in procs:
        try:
            p.wait(timeout=max(0.1, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
