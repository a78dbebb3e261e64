"""`qsync-opt predict | profile | indicate` from the command line (roofline devices: no timing)."""

from __future__ import annotations

import json
from pathlib import Path

from qsync_opt.cli.commands import main
from qsync_opt.training.plan import Plan

SPEC = """
cluster:
  groups:
    - {name: a100, device: A100-40GB}
    - {name: t4, device: T4}
  interconnect: pcie3
model: {name: tiny-cnn}
training: {global_batch: 16, optimizer: adam}
"""


def test_predict_replays_a_saved_plan(tmp_path, capsys):
    spec = tmp_path / "job.yaml"
    spec.write_text(SPEC)
    plan = tmp_path / "plan.json"
    assert main(["solve", str(spec), "-o", str(plan)]) == 0
    trace, png = tmp_path / "t.json", tmp_path / "t.png"
    assert main(["predict", str(spec), "--plan", str(plan), "--trace", str(trace), "--png", str(png)]) == 0
    out = capsys.readouterr().out
    saved = Plan.load(plan)
    assert f"{saved.iteration_ms:.2f} ms" in out  # the plan's figure is the lockstep one
    assert json.loads(trace.read_text())["otherData"]["iteration_ms"] == saved.iteration_ms
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert any("costs of t4: roofline" in n for n in saved.solver.notes)


def test_predict_names_a_group_missing_from_the_plan(tmp_path, capsys):
    spec = tmp_path / "job.yaml"
    spec.write_text(SPEC)
    plan = tmp_path / "plan.json"
    assert main(["solve", str(spec), "-o", str(plan)]) == 0
    other = tmp_path / "other.yaml"
    other.write_text(SPEC.replace("name: t4", "name: l4"))
    assert main(["predict", str(other), "--plan", str(plan)]) == 2
    assert "l4" in capsys.readouterr().err


def test_profile_refuses_a_spec_with_nothing_to_measure(tmp_path, capsys):
    spec = tmp_path / "job.yaml"
    spec.write_text(SPEC)
    assert main(["profile", str(spec), "-o", str(tmp_path / "p.json")]) == 2
    assert "no group" in capsys.readouterr().err


def test_indicate_writes_omega(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("QSYNC_OPT_PROFILE_DIR", str(tmp_path))
    spec = tmp_path / "job.yaml"
    spec.write_text(SPEC + "indicator: {method: gvar, calibration: {batches: 1, batch_size: 4}}\n")
    out = tmp_path / "omega.json"
    assert main(["indicate", str(spec), "-o", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["method"] == "gvar" and set(data["omega"]) == {"conv1", "conv2", "conv3", "fc"}
    assert "gvar" in capsys.readouterr().out


def test_profile_prints_the_all_reduce_fit_and_the_ddp_step(tmp_path, monkeypatch, capsys):
    """The profile's all-reduce map holds α–β fits and measured DDP steps; both are printed."""
    from qsync_opt.training.predictor import profile_run
    from qsync_opt.training.predictor.profile import Profile

    prof = Profile.new()
    prof.allreduce["gloo/2"] = {"alpha_ms": 0.25, "beta_ms_per_byte": 2e-6}
    prof.allreduce["ddp/2|abc"] = {"fp32_ms": 141.5}
    monkeypatch.setattr(profile_run, "profile_spec", lambda *a, **k: prof)
    spec = tmp_path / "job.yaml"
    spec.write_text(SPEC)
    assert main(["profile", str(spec), "-o", str(tmp_path / "p.json"), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "all-reduce gloo/2: 0.250 ms + 2.000 ms/MB" in out and "ddp/2|abc: fp32 DDP step 141.50 ms" in out


def test_profile_of_a_kind_with_nothing_to_measure_says_which_kinds_it_profiles(tmp_path, capsys):
    spec = tmp_path / "rollout.yaml"
    spec.write_text((Path(__file__).resolve().parents[2] / "examples" / "rollout_cpu_tiny.yaml").read_text())
    assert main(["profile", str(spec), "-o", str(tmp_path / "p.json")]) == 2
    err = capsys.readouterr().err
    assert "kind: rollout" in err and "training and serving specs" in err and f"qsync-opt solve {spec}" in err
    assert "trains" not in err  # not the training runner's message
    assert not (tmp_path / "p.json").exists()
