"""The pieces of `qsync-opt run` that need no training: which groups get profiled, and the measured step time."""

from __future__ import annotations

import json

import pytest

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


def test_run_on_a_serving_spec_for_absent_gpus_is_refused_before_anything_is_written(tmp_path, capsys):
    """`run` serves for real, so a spec whose devices are not here (T4s and a V100 on a CPU machine) is exit 2
    naming the group, before the solve; `solve` still plans it."""
    import torch

    from qsync_opt.cli.commands import main

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: the spec's GPUs are served on it")
    assert main(["run", "examples/serving_opt30b_t4_v100.yaml", "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "cluster.groups.0.device: T4 is not present here" in err and "qsync-opt solve SPEC" in err
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_run_on_a_cpu_serving_spec_serves_it_and_reports_predicted_beside_measured(tmp_path, capsys):
    """A serving spec on CPU groups: solve, the pipeline served by one process per stage, then serve.json,
    requests.csv, timeline.png and report.md; plan.json is the plan `solve` gives."""
    import json

    import yaml

    import qsync_opt
    from qsync_opt.cli.commands import main

    spec = {"kind": "serving", "name": "cpu-two-stage",
            "cluster": {"groups": [{"name": "a", "device": "cpu-local", "count": 2}], "interconnect": "loopback"},
            "serving": {"model": {"layers": 2, "hidden": 32, "ffn": 64, "heads": 2, "vocab": 256,
                                  "max_positions": 64, "ffn_matrices": 3, "tied_embeddings": False},
                        "prompt_len": 8, "gen_tokens": 4, "global_batch": 4, "bits": [8, 16],
                        "runtime": {"family": "llama", "requests": 8}},
            "solver": {"time_limit_s": 10}}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    out = tmp_path / "out"
    assert main(["run", str(path), "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert {"plan.json", "serve.json", "requests.csv", "timeline.png", "report.md", "pipeline"} <= {
        p.name for p in out.iterdir()}
    ran = json.loads((out / "plan.json").read_text())
    solved = json.loads(qsync_opt.solve(str(path)).to_json())
    assert ran["stages"] == solved["stages"]
    m = json.loads((out / "serve.json").read_text())
    assert m["requests"] == 8 and len(m["ttft_ms"]) == 8 and len(m["stages"]) == len(ran["stages"])
    assert (out / "requests.csv").read_text().count("\n") == 9
    report = (out / "report.md").read_text()
    assert "| tokens/s |" in report and "predicted" in report and "measured" in report
    assert f"report: {out / 'report.md'}" in printed
