"""The pieces of `qsync-opt run` that need no training: which groups get profiled, and the measured step time."""

from __future__ import annotations

import json

from qsync_opt.training.run_stages import measured_iteration_ms, missing_profile
from qsync_opt.training.spec import load_spec


def test_costs_roofline_profiles_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("QSYNC_OPT_PROFILE_DIR", str(tmp_path))
    todo, skip = missing_profile(load_spec("examples/cpu_tiny.yaml", costs="roofline"), None)
    assert todo == {} and skip == {"native": "costs: roofline", "sse41": "costs: roofline"}


def test_devices_that_do_not_run_here_are_not_profiled(tmp_path, monkeypatch):
    monkeypatch.setenv("QSYNC_OPT_PROFILE_DIR", str(tmp_path))
    spec = load_spec("examples/hybrid_v100_t4_resnet50.yaml", costs="auto")
    todo, skip = missing_profile(spec, None)
    assert todo == {} and set(skip) == {g.name for g in spec.cluster.groups}
    assert all("does not run here" in why for why in skip.values()), skip


def test_local_groups_without_a_profile_are_profiled(tmp_path, monkeypatch):
    monkeypatch.setenv("QSYNC_OPT_PROFILE_DIR", str(tmp_path))
    todo, skip = missing_profile(load_spec("examples/cpu_tiny.yaml"), None)
    assert skip == {} and set(todo) == {"native", "sse41"}
    assert all(why.startswith("no profile at ") for why in todo.values())


def test_measured_step_is_the_slowest_rank_median_after_the_first_step(tmp_path):
    rows = {0: [900.0, 10.0, 12.0, 30.0], 1: [800.0, 11.0, 20.0, 14.0]}
    for rank, times in rows.items():
        lines = [json.dumps({"event": "start"})]
        lines += [json.dumps({"step": s + 1, "loss": 1.0, "step_ms": t}) for s, t in enumerate(times)]
        (tmp_path / f"rank{rank}.jsonl").write_text("\n".join(lines) + "\n")
    assert measured_iteration_ms(tmp_path) == (20.0, 3)  # steps 2..4: max(10,11)=11, 20, 30 -> median 20
    assert measured_iteration_ms(tmp_path / "none") is None


def test_run_on_a_serving_spec_goes_through_the_serving_kinds_stages(tmp_path, capsys):
    """A serving spec's run is its kind's stages (solve, report), not training's: plan.json is the plan `solve`
    gives and report.md prints it; nothing of training's stages is made."""
    import json

    import qsync_opt
    from qsync_opt.cli.commands import main

    assert main(["run", "examples/serving_opt30b_t4_v100.yaml", "-o", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json", "report.md"]
    ran = json.loads((tmp_path / "plan.json").read_text())
    solved = json.loads(qsync_opt.solve("examples/serving_opt30b_t4_v100.yaml").to_json())
    assert ran["stages"] == solved["stages"] and ran["prediction"] == solved["prediction"]
    report = (tmp_path / "report.md").read_text()
    assert "stage" in report and "prefill ms/mb" in report
    assert f"report: {tmp_path / 'report.md'}" in printed
