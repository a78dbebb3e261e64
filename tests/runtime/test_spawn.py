"""The launcher's watch over its ranks, with stand-in ranks (plain Python, no torch): fast and exact.

A real rank blocked at the rendezvous behaves like `sleep`: it never exits by itself. These
tests use that stand-in so they check the launcher's logic, not torch's start-up time.
"""

from __future__ import annotations

import sys
import time

from qsync_opt.runtime.spawn import spawn_ranks
from qsync_opt.training.runtime.trainer import EXIT_STOPPED

RANK = ("import os, sys, time\n"
        "r = int(os.environ['RANK'])\n"
        "{body}\n")


def envs(n, **extra):
    import os

    return [{**os.environ, "RANK": str(r), "QSYNC_GROUP": f"g{r}", **extra} for r in range(n)]


def run(body, n=2, **kw):
    argv = [sys.executable, "-c", RANK.format(body=body)]
    t0 = time.monotonic()
    out = spawn_ranks(argv, envs(n), **kw)
    return out, time.monotonic() - t0


def test_a_later_rank_dying_stops_the_earlier_one_waiting_for_it():
    """The issue's hang: rank 1 dies at start-up while rank 0 waits for it for ever."""
    out, took = run("if r == 1:\n    print('bad OMP_NUM_THREADS', file=sys.stderr); sys.exit(2)\ntime.sleep(600)",
                    kill_after_s=1.0)
    assert out.codes[1] == 2 and out.codes[0] != 0, out.codes
    assert out.failed_code == 2
    assert "rank 1 (group g1) exited with code 2" in out.failure
    assert "bad OMP_NUM_THREADS" in out.failure, "the failed rank's stderr tail is in the message"
    assert took < 300, "the launcher returned instead of hanging"


def test_a_rank_killed_by_a_signal_is_named_with_the_signal():
    out, _ = run("if r == 0:\n    os.kill(os.getpid(), 9)\ntime.sleep(600)", kill_after_s=1.0)
    assert "rank 0 (group g0) was killed by SIGKILL" in out.failure
    assert "its stderr was empty" in out.failure


def test_a_rank_that_ignores_sigterm_is_killed(tmp_path):
    flag = tmp_path / "ignoring"
    out, _ = run("import signal, pathlib\nflag = pathlib.Path(%r)\n"
                 "if r == 0:\n    signal.signal(signal.SIGTERM, signal.SIG_IGN); flag.touch(); time.sleep(600)\n"
                 "while not flag.exists():\n    time.sleep(0.01)\nsys.exit(1)" % str(flag), kill_after_s=0.5)
    assert out.codes[0] == -9 and out.codes[1] == 1


def test_start_up_timeout_names_the_ranks_that_never_became_ready(tmp_path):
    """Rank 0 is past start-up before anything starts (its ready file exists), so the 1 s timeout
    cannot catch it however slowly Python starts here; rank 1 never gets there."""
    argv = [sys.executable, "-c", RANK.format(body="time.sleep(600)")]
    e = envs(2)
    for r in range(2):
        e[r]["QSYNC_READY_FILE"] = str(tmp_path / f"ready{r}")
    (tmp_path / "ready0").touch()
    out = spawn_ranks(argv, e, start_timeout_s=1.0, kill_after_s=0.5)
    assert out.failed_code == 1
    assert "rank 1 (group g1) did not get past start-up and the rendezvous within 1 s" in out.failure


def test_clean_and_stopped_exits_are_not_failures():
    out, _ = run(f"sys.exit(0 if r == 0 else {EXIT_STOPPED})")
    assert out.failure is None and out.codes == [0, EXIT_STOPPED]


def test_a_forwarded_stop_ends_ranks_that_ignore_it_after_the_grace(tmp_path):
    """SIGTERM to the launcher reaches every rank; one blocked for ever is killed grace_s later."""
    import os
    import signal
    import threading

    body = ("import signal, pathlib\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            f"pathlib.Path({str(tmp_path)!r}, f'r{{r}}').touch()\ntime.sleep(600)")

    def stop_when_both_ignore():
        while not all((tmp_path / f"r{r}").exists() for r in range(2)):
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=stop_when_both_ignore, daemon=True).start()
    out, _ = run(body, grace_s=1.0)
    assert out.signalled and out.failure is None and out.codes == [-9, -9]
