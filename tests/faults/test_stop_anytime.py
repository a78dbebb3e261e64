"""A stop at any moment ends `train` with exit 4 and status: stopped, within the grace period.

Before, a SIGTERM while the first step ran (here: a model whose first forward in a rank takes
a minute) let the ranks run on until the launcher killed them 30 s later, and `train` said
"training failed: None" with exit 1."""

from __future__ import annotations

import json
import signal
import time

import pytest
import yaml
from faults_helpers import children, cli, wait_for

from qsync_opt.training.plan import GroupPlan, Plan, Provenance, SolverReport

pytestmark = pytest.mark.timeout(300)

SLOW_MODEL = '''
import os, time
import torch
from torch import nn


class SlowFirstForward(nn.Module):
    """A small MLP whose first forward in a training rank sleeps (a first step that takes minutes)."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 16), nn.Linear(16, 4)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        if "RANK" in os.environ and self.calls == 1:
            time.sleep(120)
        return self.fc2(torch.relu(self.fc1(x)))


def make():
    return SlowFirstForward()
'''


def _job(tmp):
    (tmp / "slow_model.py").write_text(SLOW_MODEL)
    groups = [{"name": "a", "device": "cpu-local", "count": 1, "local_batch": 4},
              {"name": "b", "device": "cpu-local", "count": 1, "local_batch": 4}]
    data = {"name": "stop", "cluster": {"groups": groups, "interconnect": "loopback"},
            "model": {"import": "slow_model:make", "input_shape": [8]},
            "training": {"global_batch": 8, "steps": 5}}
    spec = tmp / "spec.yaml"
    spec.write_text(yaml.safe_dump(data))
    groups = {g["name"]: GroupPlan(device="cpu-local", count=1, local_batch=4,
                                   precisions={"fc1": "fp32", "fc2": "fp32"}, compute_ms=1.0, comm_exposed_ms=0.0,
                                   iteration_ms=1.0, peak_memory_bytes=1.0, memory_capacity_bytes=1e9, indicator=0.0)
              for g in groups}
    plan = Plan(job="stop", model="slow_model:make", objective="accuracy_degradation", groups=groups,
                iteration_ms=1.0, indicator=0.0,
                solver=SolverReport(backend="test", status="heuristic", objective=0.0, wall_s=0.0),
                provenance=Provenance(spec_digest="test", versions={})).save(tmp / "plan.json")
    return spec, plan


def _started(metrics, rank):
    f = metrics / f"rank{rank}.jsonl"
    return f.exists() and '"event": "start"' in f.read_text()


@pytest.mark.slow
def test_a_stop_during_the_first_step_exits_4_stopped(tmp_path, sig=signal.SIGTERM):
    """(SIGINT takes the same handler in the ranks; the test below sends it to the launcher.)"""
    spec, plan = _job(tmp_path)
    metrics = tmp_path / "m"
    proc = cli("train", str(spec), "--plan", str(plan), "--metrics-dir", str(metrics), cwd=str(tmp_path))
    wait_for(lambda: len(children(proc.pid)) == 2 and _started(metrics, 0) and _started(metrics, 1), proc,
             what="both ranks in their first step")
    proc.send_signal(sig)
    t = time.monotonic()
    out, err = proc.communicate(timeout=120)
    took = time.monotonic() - t
    print(f"\n{sig.name} in the first step: exit {proc.returncode} after {took:.1f} s")
    assert proc.returncode == 4, (out[-1500:], err[-1500:])
    result = json.loads((metrics / "result.json").read_text())
    assert result["status"] == "stopped" and result["failure"] is None and not result["killed_after_grace"]
    assert all(rc in (4, -signal.SIGTERM) for rc in result["returncodes"]), result["returncodes"]
    assert "before the first step ended" in out and "training failed" not in err
    assert took < 25  # hang detector: well inside the 30 s grace, where the old ranks ran to their kill


def test_a_stop_before_any_rank_starts_exits_4(tmp_path, monkeypatch, capsys):
    from qsync_opt.cli import commands as qcli
    from qsync_opt.training.runtime import launch
    def validate(*a, **k):  # the signal arrives while the launcher still checks its input
        signal.raise_signal(signal.SIGINT)  # (SIGINT: on the old code it ends this test, not pytest)

    monkeypatch.setattr(launch, "validate", validate)
    monkeypatch.setattr(launch, "spawn_ranks", lambda *a, **k: pytest.fail("ranks were started"))
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump({"name": "s", "cluster": {"groups": [{"name": "a", "device": "cpu-local"}]},
                                    "model": {"name": "tiny-cnn"}, "training": {"global_batch": 4}}))
    plan = tmp_path / "p.json"
    plan.write_text("{}")
    monkeypatch.setattr(launch.Plan, "load", classmethod(lambda cls, p: None))
    assert qcli.main(["train", str(spec), "--plan", str(plan)]) == 4
    assert "stopped by SIGINT before any rank started" in capsys.readouterr().out


def test_ranks_killed_at_the_end_of_the_grace_period_are_stopped_not_failed(tmp_path):
    from qsync_opt.training.runtime.launch import _collect
    from qsync_opt.runtime.spawn import Spawned

    spawned = Spawned([-9, -9], signalled=True, killed_after_grace=True)
    r = _collect(spawned, tmp_path, 8, None, {})
    assert (r.status, r.exit_code, r.summary()["killed_after_grace"]) == ("stopped", 4, True)
    assert _collect(Spawned([-9, -9], signalled=True), tmp_path, 8, None, {}).status == "failed"  # not ours: failed
