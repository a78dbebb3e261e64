"""A stop (SIGINT, SIGTERM) is a stop everywhere: `run` at any stage and `train` before its ranks
start end with exit 4 and "stopped", record nothing unfinished as done, and the next `run` resumes;
refusals that need no work (the plan against the spec, emulation) come before any model or data work.

Before, Ctrl-C during `run`'s training exited 0 with a report "as if complete" and cached every
stage, so the next run never trained the remaining steps; SIGTERM while `train` prepared its
synthetic data exited 2 ("error: data ...: reading samples failed with _Stopped"); and a plan
from another spec was refused after `train` had printed a metrics folder it never made.
The subprocess tests signal at a point the job itself reports (a line of output), never after a delay.
"""

from __future__ import annotations

import json
import signal
import threading
from pathlib import Path

import pytest
import yaml
from faults_helpers import cli, wait_for

from qsync_opt.cli.commands import main
from qsync_opt.training import run as run_mod
from qsync_opt.training.plan import GroupPlan, Plan, Provenance, SolverReport

pytestmark = pytest.mark.timeout(300)

GATED_MODEL = '''
import os, signal, time
from pathlib import Path
import torch
from torch import nn

GATE = Path(__file__).with_name("gate")
_calls, _signalled = 0, []


def _chain():
    """Note a SIGTERM to this rank, then hand it to the trainer's own handler."""
    old = signal.getsignal(signal.SIGTERM)

    def note(signum, frame):
        _signalled.append(signum)
        if callable(old):
            old(signum, frame)

    signal.signal(signal.SIGTERM, note)


class Gated(nn.Module):
    """A small MLP; in a training rank, while GATE exists, step 3's forward waits for the stop
    (so the stop lands in step 3 whatever the machine's speed)."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 16), nn.Linear(16, 4)

    def forward(self, x):
        global _calls
        if "RANK" in os.environ and self.training:
            _calls += 1
            if _calls == 1:
                _chain()
            if _calls == 3 and GATE.exists():
                end = time.monotonic() + 120
                while not _signalled and time.monotonic() < end:
                    time.sleep(0.01)
        return self.fc2(torch.relu(self.fc1(x)))


def make():
    return Gated()
'''

SLOW_TEACHER = '''
import os, sys, time
import torch
from torch import nn


class SlowTeacher(nn.Module):
    """A small MLP whose forward outside a rank (the launcher labelling the synthetic data with
    the teacher) says so and then takes minutes."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        if "RANK" not in os.environ and not self.training:
            sys.stderr.write("teacher labelling\\n")
            sys.stderr.flush()
            time.sleep(120)
        return self.fc(x)


def make():
    return SlowTeacher()
'''


class _Lines:
    """Every line a stream gives, collected by a thread (the test waits for one, never for a time)."""

    def __init__(self, stream):
        self.lines: list[str] = []
        self._t = threading.Thread(target=lambda: self.lines.extend(iter(stream.readline, "")), daemon=True)
        self._t.start()

    def has(self, text: str) -> bool:
        return any(text in line for line in list(self.lines))

    def text(self) -> str:
        self._t.join(timeout=10)
        return "".join(self.lines)


def _two_groups(devices=("cpu-local", "cpu-local")) -> list[dict]:
    return [{"name": n, "device": d, "count": 1, "local_batch": 4} for n, d in zip("ab", devices)]


def _spec(tmp: Path, model: dict, groups: list[dict], name: str = "stops", steps: int = 6) -> Path:
    data = {"name": name, "kind": "training", "cluster": {"groups": groups, "interconnect": "loopback"},
            "model": model, "costs": "roofline",
            "training": {"global_batch": sum(g["local_batch"] for g in groups), "optimizer": "sgd", "steps": steps},
            "solver": {"backend": "greedy"}}
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _plan(tmp: Path, groups: list[dict], model: str, ops: list[str], job: str = "stops") -> Path:
    gp = {g["name"]: GroupPlan(device=g["device"], count=g["count"], local_batch=g["local_batch"],
                               precisions={n: "fp32" for n in ops}, compute_ms=1.0, comm_exposed_ms=0.0,
                               iteration_ms=1.0, peak_memory_bytes=1.0, memory_capacity_bytes=1e9, indicator=0.0)
          for g in groups}
    return Plan(job=job, model=model, objective="accuracy_degradation", groups=gp, iteration_ms=1.0, indicator=0.0,
                solver=SolverReport(backend="test", status="heuristic", objective=0.0, wall_s=0.0),
                provenance=Provenance(spec_digest="test", versions={})).save(tmp / f"{job}-plan.json")


@pytest.mark.slow
def test_ctrl_c_in_runs_training_exits_4_caches_nothing_unfinished_and_the_next_run_resumes(tmp_path):
    (tmp_path / "gated_model.py").write_text(GATED_MODEL)
    (tmp_path / "gate").touch()
    spec = _spec(tmp_path, {"import": "gated_model:make", "input_shape": [8]}, _two_groups())
    out = tmp_path / "out"
    proc = cli("run", str(spec), "-o", str(out), cwd=str(tmp_path))
    lines = _Lines(proc.stdout)
    wait_for(lambda: lines.has("[rank 0 a] step 2 ") and lines.has("[rank 1 b] step 2 "), proc,
             what="both ranks past step 2 (step 3 then waits for the stop)")
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    log = lines.text()
    assert proc.returncode == 4, (log[-2000:], err[-2000:])
    assert "stopped by SIGINT during stage 'train'; training stopped after step 3" in err, err
    assert f"continue with: qsync-opt run {spec} -o {out}" in err and "error" not in err.lower(), err
    assert "report:" not in log
    manifest = json.loads((out / "run.json").read_text())
    assert manifest["status"] == "stopped" and manifest["stopped"]["stage"] == "train", manifest
    assert list(manifest["stages"]) == ["profile", "indicate", "solve", "predict"], manifest  # train not done
    assert json.loads((out / "train" / "result.json").read_text())["status"] == "stopped"
    report = (out / "report.md").read_text()
    assert "**stopped** by SIGINT during stage `train`" in report and "## Plan" not in report, report

    (tmp_path / "gate").unlink()
    proc = cli("run", str(spec), "-o", str(out), cwd=str(tmp_path))
    log, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, (log[-2000:], err[-2000:])
    for s in ("profile", "indicate", "solve", "predict"):
        assert f"[{s}] cached" in log, log
    assert "[train] running" in log and "resuming the stopped training from" in log and "start_step=3" in log, log
    steps = [json.loads(x)["step"] for x in (out / "train" / "rank0.jsonl").read_text().splitlines() if '"loss"' in x]
    assert steps == [1, 2, 3, 4, 5, 6], steps  # steps 4-6 only were trained again
    manifest = json.loads((out / "run.json").read_text())
    assert manifest["status"] == "completed" and list(manifest["stages"])[-1] == "report", manifest
    assert "stopped" not in (out / "report.md").read_text()


STAGES = list(run_mod.STAGES)


@pytest.mark.parametrize("stage", STAGES)
def test_a_stop_in_any_stage_of_run_exits_4_and_the_next_run_reruns_that_stage(tmp_path, monkeypatch, capsys, stage):
    def fake(name):
        def fn(ctx):
            if name == stage and not (tmp_path / "stopped-once").exists():
                (tmp_path / "stopped-once").touch()
                signal.raise_signal(signal.SIGINT)  # (SIGINT: on the old code it ends this test, not pytest)
            path = ctx.out / f"{name}.txt"
            path.write_text(name)
            return str(path)
        return fn

    monkeypatch.setattr(run_mod, "STAGES", {n: fake(n) for n in STAGES})
    spec = _spec(tmp_path, {"name": "tiny-cnn"}, _two_groups())
    out = tmp_path / "out"
    assert main(["run", str(spec), "-o", str(out)]) == 4
    err = capsys.readouterr().err
    assert f"stopped by SIGINT during stage '{stage}'" in err and "continue with: qsync-opt run" in err, err
    manifest = json.loads((out / "run.json").read_text())
    before = STAGES[:STAGES.index(stage)]
    assert list(manifest["stages"]) == before and manifest["status"] == "stopped", manifest
    assert f"**stopped** by SIGINT during stage `{stage}`" in (out / "report.md").read_text()

    assert main(["run", str(spec), "-o", str(out)]) == 0
    log = capsys.readouterr().out
    assert all(f"[{s}] cached" in log for s in before) and f"[{stage}] running" in log, log
    assert json.loads((out / "run.json").read_text())["status"] == "completed"


@pytest.mark.slow
def test_sigterm_while_train_prepares_its_data_is_a_stop_not_an_error(tmp_path):
    (tmp_path / "slow_teacher.py").write_text(SLOW_TEACHER)
    groups = _two_groups()
    spec = _spec(tmp_path, {"import": "slow_teacher:make", "input_shape": [8]}, groups)
    plan = _plan(tmp_path, groups, "slow_teacher:make", ["fc"])
    proc = cli("train", str(spec), "--plan", str(plan), "--metrics-dir", str(tmp_path / "m"), cwd=str(tmp_path))
    lines = _Lines(proc.stderr)
    wait_for(lambda: lines.has("teacher labelling"), proc, what="the launcher labelling the synthetic data")
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    err = lines.text()
    assert proc.returncode == 4, (out, err[-2000:])
    assert "stopped by SIGTERM before any rank started" in out and "error" not in err, (out, err[-2000:])


def test_a_plan_from_another_spec_is_refused_before_any_work_and_names_no_folder(tmp_path, monkeypatch, capsys):
    from qsync_opt.training.runtime import launch

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(launch, "validate", lambda *a, **k: pytest.fail("model and data work before the refusal"))
    spec = _spec(tmp_path, {"name": "tiny-cnn"}, _two_groups())
    other = [{"name": "v100", "device": "V100-32GB", "count": 1, "local_batch": 8}]
    plan = _plan(tmp_path, other, "tiny-cnn", ["conv1"], job="other")
    metrics = tmp_path / "m"
    assert main(["train", str(spec), "--plan", str(plan), "--metrics-dir", str(metrics)]) == 2
    cap = capsys.readouterr()
    assert f"--plan {plan}: solved for groups ['v100'] (job 'other')" in cap.err, cap.err
    assert "this spec's cluster.groups are ['a', 'b']" in cap.err and "qsync-opt solve" in cap.err, cap.err
    assert "metrics:" not in cap.out and not metrics.exists() and not (tmp_path / "qsync-runs").exists(), cap.out


def test_the_emulation_refusal_comes_before_any_model_or_data_work(tmp_path, monkeypatch, capsys):
    from qsync_opt.training.runtime import launch

    monkeypatch.setenv("QSYNC_DEVICE", "cpu")  # no CUDA here, whatever the machine has
    monkeypatch.setattr(launch, "validate", lambda *a, **k: pytest.fail("model and data work before the refusal"))
    groups = _two_groups(("V100-32GB", "cpu-local"))
    spec = _spec(tmp_path, {"name": "tiny-cnn"}, groups)
    plan = _plan(tmp_path, groups, "tiny-cnn", ["conv1"])
    metrics = tmp_path / "m"
    assert main(["train", str(spec), "--plan", str(plan), "--metrics-dir", str(metrics)]) == 2
    cap = capsys.readouterr()
    assert "would be emulated more than 10x slower" in cap.err and "--emulate" in cap.err, cap.err
    assert "metrics:" not in cap.out and not metrics.exists(), cap.out
