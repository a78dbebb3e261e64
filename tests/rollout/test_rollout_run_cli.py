"""`qsync-opt run` on a rollout spec: the plan, the timeline and KV PNGs and report.md in the output folder; options
that belong to a training run exit 2 naming themselves."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qsync_opt.cli.commands import main
from qsync_opt.jobs import load_spec
from qsync_opt.rollout.plan import solve
from qsync_opt.rollout.simulate import VARIANTS

SPEC = str(Path(__file__).resolve().parents[2] / "examples" / "rollout_cpu_tiny.yaml")


def test_run_writes_the_plan_pictures_and_report(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["run", SPEC, "-o", str(out), "--steps", "6"]) == 0
    plan = json.loads((out / "plan.json").read_text())
    assert plan["steps"] == 6 and [p["variant"] for p in plan["policies"]] == list(VARIANTS)
    want = solve(load_spec(SPEC), steps=6)  # the same figures as `qsync-opt solve`
    assert plan["recommended"] == want.recommended
    assert [p["trajectories_per_s"] for p in plan["policies"]] == [p.trajectories_per_s for p in want.policies]
    for png in ("timeline.png", "kv_utilisation.png"):
        data = (out / png).read_bytes()
        assert data[:4] == b"\x89PNG" and len(data) > 10_000, png
    report = (out / "report.md").read_text()
    assert f"**Recommended: {want.recommended}**" in report
    for v in VARIANTS:
        assert f"| {v}" in report, v
    assert "![timeline](timeline.png)" in report and "Per-worker timeline (sync, " in report
    printed = capsys.readouterr().out
    assert "recommended:" in printed and str(out / "report.md") in printed


@pytest.mark.parametrize("args, named", [(["--from", "solve"], "--from"), (["--emulate"], "--emulate"),
                                         (["--steps", "0"], "--steps 0")])
def test_training_options_and_bad_steps_exit_2_naming_them(tmp_path, capsys, args, named):
    assert main(["run", SPEC, "-o", str(tmp_path / "run"), *args]) == 2
    err = capsys.readouterr().err
    assert named in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()  # refused before anything was written


def test_pictured_variants_are_sync_the_best_plain_async_and_the_recommended():
    from types import SimpleNamespace

    from qsync_opt.rollout.run_report import pictured

    def plan(rec, **tps):
        return SimpleNamespace(recommended=rec, policies=[SimpleNamespace(variant=v, trajectories_per_s=t)
                                                          for v, t in tps.items()])

    figs = {"sync": 1.0, "one-step-off": 2.0, "stale": 3.0, "partial-rollout": 0.5, "trajectory-async": 4.0,
            "repack-best-fit": 4.5, "repack-program": 4.6}
    assert pictured(plan("repack-best-fit", **figs)) == ["sync", "trajectory-async", "repack-best-fit"]
    figs["partial-rollout"] = 5.0  # the recommended is the best plain one: drawn once
    assert pictured(plan("partial-rollout", **figs)) == ["sync", "partial-rollout"]


def test_real_run_writes_measured_beside_predicted(tmp_path, capsys):
    """--real: every policy run here on Ray actors (2 steps, 1 round), measured.csv beside the calibrated simulator,
    and the table added to report.md. No figure is asserted: the machine's load moves them."""
    pytest.importorskip("ray")
    import csv

    out = tmp_path / "run"
    assert main(["run", SPEC, "-o", str(out), "--steps", "2", "--real"]) == 0
    text = (out / "measured.csv").read_text()
    assert text.startswith("# cpu-tiny: every policy on Ray actors here, 1 interleaved round(s)")
    rows = list(csv.DictReader(line for line in text.splitlines() if not line.startswith("#")))
    assert [r["policy"] for r in rows] == list(VARIANTS)
    for r in rows:
        assert float(r["real_trajectories_per_s"]) > 0 and float(r["predicted_trajectories_per_s"]) > 0
        assert r["lost_actors"] == "0"
    assert json.loads((out / "plan.json").read_text())["steps"] == 2
    report = (out / "report.md").read_text()
    assert "## Measured here (1 round(s) on Ray actors" in report and "**Recommended:" in report
    printed = capsys.readouterr().out
    assert "measured here vs the calibrated simulator" in printed
    plan = json.loads((out / "plan.json").read_text())  # report.md, the console and plan.json: one recommendation
    assert plan["evidence"] == "measured here"
    assert f"**Recommended: {plan['recommended']}** (measured here" in report
    assert f"recommended (measured here): {plan['recommended']} —" in printed


@pytest.mark.parametrize("spec, args, named", [
    (SPEC, ["--rounds", "0"], "--rounds 0"),
    (str(Path(SPEC).parent / "rollout_laminar.yaml"), ["--real"], "rollout.model: the real run builds llama-3-8b"),
    (str(Path(SPEC).parent / "cpu_tiny.yaml"), ["--real"], "--real: a training run does not take it"),
    (str(Path(SPEC).parent / "cpu_tiny.yaml"), ["--rounds", "3"], "--rounds: a training run does not take it"),
])
def test_real_run_options_exit_2_before_anything_runs(tmp_path, capsys, spec, args, named, monkeypatch):
    from qsync_opt.rollout import ray_run

    monkeypatch.setattr(ray_run, "_available_bytes", lambda: 24 * 2**30)  # this machine's memory on any machine
    assert main(["run", spec, "-o", str(tmp_path / "run"), *args]) == 2
    err = capsys.readouterr().err
    assert named in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()


def test_solve_prints_each_policy_on_stderr_as_it_is_simulated_and_json_stays_clean(capsys):
    import logging

    assert main(["solve", SPEC, "--json"]) == 0
    captured = capsys.readouterr()
    plan = json.loads(captured.out)  # stdout: the plan alone
    assert "simulating 7 policies of cpu-tiny" in captured.err
    for p in plan["policies"]:  # one progress line per policy, with the figure the plan reports
        assert f"{p['variant']:<17s} {p['trajectories_per_s']:8.2f} traj/s  simulated in" in captured.err
    lg = logging.getLogger("qsync_opt.rollout.plan")
    assert not lg.handlers and lg.level == logging.NOTSET  # the CLI's handler is gone: a library caller stays quiet


def test_the_library_logs_progress_only_to_a_caller_that_listens(caplog):
    import logging

    from qsync_opt.rollout.plan import simulate_variants

    job = load_spec(SPEC)
    with caplog.at_level(logging.INFO, logger="qsync_opt.rollout.plan"):
        got = simulate_variants(job, processes=1, steps=2)
    lines = [r.getMessage() for r in caplog.records if r.name == "qsync_opt.rollout.plan"]
    assert lines[0] == "simulating 7 policies of cpu-tiny for 2 trainer steps"
    assert [ln.split()[0] for ln in lines[1:]] == list(got) == list(VARIANTS)
