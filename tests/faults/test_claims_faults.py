"""Promises of `qsync-opt train` not covered elsewhere: SIGINT stops with exit 4, `--force` applies a plan
solved for another graph (and without it the run is refused), and when one rank dies the others are
stopped within a bounded time (a hang detector, HANG_S, against ranks that would otherwise wait for ever;
the real two-rank case is tests/faults/test_rank_faults.py's kill -9 mid-run)."""

from __future__ import annotations

import json
import os
import signal
import sys

import pytest
from faults_helpers import HANG_S, cli, kill, loss_lines, tiny_job, wait_for

from qsync_opt.training.plan import Plan, make_fingerprint
from qsync_opt.runtime.spawn import spawn_ranks

pytestmark = pytest.mark.timeout(400)


@pytest.mark.slow
def test_sigint_to_the_launcher_stops_with_exit_4(tmp_path):
    spec, plan = tiny_job(tmp_path)
    ck = tmp_path / "ck"
    proc = cli("train", str(spec), "--plan", str(plan), "--checkpoint-dir", str(ck), "--checkpoint-every", "1", "--json")
    wait_for(lambda: len(loss_lines(ck / "metrics")) >= 2, proc, what="2 steps")
    kill(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 4, err[-2000:]
    result = json.loads(out)
    assert result["status"] == "stopped" and result["exit_code"] == 4
    assert "stopped on a signal after step" in err


@pytest.mark.slow
def test_force_applies_a_plan_solved_for_another_graph(tmp_path):
    spec, plan_path = tiny_job(tmp_path)
    plan = Plan.load(plan_path)
    ops = {fqn: "conv2d[1,1,1,1]" for fqn in plan.groups["fast"].precisions}  # same names, other shapes
    other = plan.model_copy(update={"fingerprint": make_fingerprint(ops)}).save(tmp_path / "other.json")
    refused = cli("train", str(spec), "--plan", str(other), "--steps", "2")
    _, err = refused.communicate(timeout=300)
    assert refused.returncode == 2, err[-2000:]
    assert "does not fit this" in err and "--force" in err and "Traceback" not in err
    forced = cli("train", str(spec), "--plan", str(other), "--steps", "2", "--force", "--json")
    out, err = forced.communicate(timeout=300)
    assert forced.returncode == 0, err[-2000:]
    result = json.loads(out)
    assert result["status"] == "completed" and result["steps_done"] == 2


def test_stand_in_ranks_waiting_for_a_dead_peer_are_terminated(tmp_path):
    """Without torch: ranks that would sleep 600 s are stopped by the launcher (SIGTERM), not by themselves."""
    body = "import os, sys, time\nr = int(os.environ['RANK'])\nif r == 2:\n    sys.exit(3)\ntime.sleep(600)\n"
    envs = [{**os.environ, "RANK": str(r), "QSYNC_GROUP": f"g{r}"} for r in range(3)]
    out = spawn_ranks([sys.executable, "-c", body], envs, kill_after_s=1.0)
    assert out.failed_code == 3
    assert out.codes[:2] == [-signal.SIGTERM, -signal.SIGTERM], out.codes
    assert out.wall_s < HANG_S
