"""Fault injection on real two-rank runs of `qsync-opt train`: kill -9, SIGSTOP, SIGTERM, corruption.

Each case asserts the exit code, the message (which rank, which group, how it ended) and that
nothing written before the fault is lost: published checkpoints stay valid and the metrics
lines already logged are still there. Times to exit are printed (run with -s to see them);
they are asserted only against a hang detector (HANG_S: the other rank stopped at all).
"""

from __future__ import annotations

import json
import signal
import time

import pytest
from faults_helpers import HANG_S, children, cli, gone, kill, loss_lines, tiny_job, wait_for

from qsync_opt.runtime import checkpoint as ckpt

pytestmark = pytest.mark.timeout(400)
GROUP = {0: "fast", 1: "slow"}


@pytest.mark.parametrize("rank", [0, 1])
def test_kill9_of_a_rank_at_start_up_ends_the_job_naming_it(tmp_path, rank):
    spec, plan = tiny_job(tmp_path)
    proc = cli("train", str(spec), "--plan", str(plan), "--checkpoint-dir", str(tmp_path / "ck"))
    pid = wait_for(lambda: children(proc.pid).get(rank), proc, what=f"rank {rank} to start")
    t_kill = kill(pid)
    out, err = proc.communicate(timeout=120)
    took = time.monotonic() - t_kill
    print(f"\nkill -9 rank {rank} at start-up: exit {proc.returncode} {took:.1f} s after the kill")
    assert proc.returncode == 1, err[-2000:]
    assert f"training failed: rank {rank} (group {GROUP[rank]}) was killed by SIGKILL" in err
    assert "stopped the other ranks" in err


@pytest.mark.parametrize("rank", [0, 1])
def test_kill9_of_a_rank_mid_run_keeps_checkpoints_and_metrics(tmp_path, rank):
    spec, plan = tiny_job(tmp_path)
    ck = tmp_path / "ck"
    proc = cli("train", str(spec), "--plan", str(plan), "--checkpoint-dir", str(ck), "--checkpoint-every", "1")
    wait_for(lambda: len(loss_lines(ck / "metrics")) >= 3 and ckpt.latest(ck) is not None, proc, what="3 steps")
    before_ckpt = ckpt.latest(ck)
    before_lines = loss_lines(ck / "metrics", 0)
    ranks = children(proc.pid)
    t_kill = kill(ranks[rank])
    other = ranks[1 - rank]
    while not gone(other) and time.monotonic() - t_kill < HANG_S:  # blocked in a collective on a dead peer
        time.sleep(0.05)
    assert gone(other), f"rank {1 - rank} still running {HANG_S:g} s after rank {rank} was killed"
    out, err = proc.communicate(timeout=120)
    took = time.monotonic() - t_kill
    after = ckpt.choose(ck)
    print(f"\nkill -9 rank {rank} mid-run: exit {proc.returncode} {took:.1f} s after the kill; "
          f"kept checkpoint {after.path.name}, skipped {[(p.name, why) for p, why in after.skipped]}")
    assert proc.returncode == 1, err[-2000:]
    assert f"training failed: rank {rank} (group {GROUP[rank]}) was killed by SIGKILL" in err
    assert after.path is not None and after.path.name >= before_ckpt.name, "a published checkpoint was lost"
    assert loss_lines(ck / "metrics", 0)[:len(before_lines)] == before_lines, "logged metrics were lost"
    assert json.loads((ck / "metrics" / "result.json").read_text())["status"] == "failed"


def test_a_rank_stuck_at_start_up_hits_the_start_timeout(tmp_path):
    spec, plan = tiny_job(tmp_path)
    proc = cli("train", str(spec), "--plan", str(plan), "--start-timeout", "15")
    pid = wait_for(lambda: children(proc.pid).get(1), proc, what="rank 1 to start")
    t_stop = kill(pid, signal.SIGSTOP)  # alive but never reaches the rendezvous
    out, err = proc.communicate(timeout=180)
    print(f"\nSIGSTOP rank 1 at start-up, --start-timeout 15: exit {proc.returncode} "
          f"{time.monotonic() - t_stop:.1f} s after the stop")
    assert proc.returncode == 1, err[-2000:]
    assert "did not get past start-up and the rendezvous within 15 s" in err


def test_sigterm_stops_with_exit_4_then_resume_skips_a_corrupt_checkpoint(tmp_path):
    spec, plan = tiny_job(tmp_path)
    ck = tmp_path / "ck"
    proc = cli("train", str(spec), "--plan", str(plan), "--checkpoint-dir", str(ck), "--checkpoint-every", "1",
               "--json")
    wait_for(lambda: len(loss_lines(ck / "metrics")) >= 3, proc, what="3 steps")
    t_term = kill(proc.pid, signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    print(f"\nSIGTERM to the launcher: exit {proc.returncode} {time.monotonic() - t_term:.1f} s after the signal")
    assert proc.returncode == 4, err[-2000:]
    result = json.loads(out)
    assert result["status"] == "stopped" and result["exit_code"] == 4
    assert json.loads((ck / "metrics" / "result.json").read_text())["status"] == "stopped"
    k = result["steps_done"]
    newest = ckpt.latest(ck)
    assert newest.name == ckpt.step_dir(ck, k).name, "the stop checkpointed the last finished step"
    assert "stopped on a signal after step" in err

    state = newest / "state.pt"
    state.write_bytes(state.read_bytes()[: state.stat().st_size // 2])  # truncated, as a full disk would leave it
    proc = cli("train", str(spec), "--plan", str(plan), "--checkpoint-dir", str(ck), "--resume",
               "--steps", str(k + 1), "--json")
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-2000:]
    assert f"skipped checkpoint {str(newest)!r}: state.pt does not match its checksum" in err
    assert f"resuming from {str(ckpt.step_dir(ck, k - 1))!r}" in err
    result = json.loads(out)
    assert result["status"] == "completed" and result["steps_done"] == k + 1
    assert "stopped" not in err.split("trained")[-1], "a stale stop event leaked into the summary"
