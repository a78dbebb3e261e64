"""The CLI contract schedulers script against: exit codes, --json on stdout, no tracebacks."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from qsync_opt.cli.commands import main
from qsync_opt.training.plan import Plan

ROOT = Path(__file__).resolve().parents[2]
TINY = str(ROOT / "examples" / "cpu_tiny.yaml")


def run(*args):
    return subprocess.run([sys.executable, "-m", "qsync_opt.cli", *args], capture_output=True, text=True, timeout=300)


def test_json_goes_to_stdout_alone(tmp_path):
    out = tmp_path / "plan.yaml"
    r = run("solve", TINY, "--json", "-o", str(out))
    assert r.returncode == 0, r.stderr
    plan = Plan.model_validate(json.loads(r.stdout))
    assert plan == Plan.load(out)
    assert "ops per precision" in r.stderr


def test_a_reader_that_stops_early_does_not_fail_the_command():
    """`qsync-opt solve job.yaml | head -0` under `set -o pipefail`: the reader closing the pipe
    is not a failure (rich's own handler exits 1 from inside print), and nothing is printed
    about it."""
    p = subprocess.Popen([sys.executable, "-m", "qsync_opt.cli", "solve", TINY], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    p.stdout.close()  # before the plan is printed (solving takes seconds): every write meets a closed pipe
    err = p.stderr.read()
    p.wait(timeout=300)
    assert p.returncode == 0, err.decode()
    assert b"ops per precision" not in err  # the plan went to stdout, not elsewhere
    assert b"Traceback" not in err and b"Broken pipe" not in err


def test_bad_spec_exits_2_with_field_and_no_traceback(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(Path(TINY).read_text().replace("count: 1", "count: 0", 1))
    r = run("solve", str(bad))
    assert r.returncode == 2
    assert "cluster.groups.0.count" in r.stderr and "Traceback" not in r.stderr


def test_infeasible_exits_3_with_diagnosis(tmp_path):
    bad = tmp_path / "tight.yaml"
    bad.write_text(Path(TINY).read_text().replace("count: 1\n    - name: sse41", "count: 1\n      memory_gb: 0.527\n    - name: sse41"))
    r = run("solve", str(bad))
    assert r.returncode == 3, r.stderr
    assert "native: memory needs" in r.stderr


@pytest.mark.parametrize("fmt", ["json", "mps", "lp"])
def test_export_problem_and_resolve(tmp_path, fmt, capsys):
    path, plan_path = tmp_path / f"p.{fmt}", tmp_path / "plan.json"
    assert main(["solve", TINY, "--export-problem", str(path), "--backend", "highs", "-o", str(plan_path)]) == 0
    assert path.stat().st_size > 0
    plan = Plan.load(plan_path)
    assert plan.solver.status == "optimal" and plan.solver.refine_rounds == 0  # the exported program's optimum
    capsys.readouterr()
    # another solver, same file; --gap 0: at a non-zero gap CBC stops right at it and may honestly say "feasible"
    assert main(["solve", "--problem", str(path), "--backend", "cbc", "--gap", "0", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["status"] == "optimal"
    assert res["objective"] == pytest.approx(plan.solver.objective, rel=2e-4)  # both stop within rel_gap 1e-4
    # decoded into a plan over the same ops (the JSON twin): a tie may pick other precisions at the same time
    assert {g: set(ops) for g, ops in res["assignment"].items()} == {g: set(gp.precisions) for g, gp in plan.groups.items()}
    if fmt != "json":  # a stock solver reads the file alone: its optimum times objective_unit is the plan's
        import highspy

        from qsync_opt.solver.linear_file import objective_unit_of

        h = highspy.Highs()
        h.setOptionValue("output_flag", False)
        assert h.readModel(str(path)) == highspy.HighsStatus.kOk
        h.run()
        assert h.getModelStatus() == highspy.HighsModelStatus.kOptimal
        stock = h.getInfo().objective_function_value * objective_unit_of(str(path))
        assert stock == pytest.approx(plan.solver.objective, rel=2e-4)


def test_devices_and_models_list(capsys):
    assert main(["devices"]) == 0
    out = capsys.readouterr().out
    assert "T4" in out and "H100-SXM" in out
    assert main(["models"]) == 0
    assert "resnet50" in capsys.readouterr().out


def test_bench_solvers_writes_table_csv_and_png(tmp_path, capsys):
    code = main(["bench", "solvers", "--models", "tiny-resnet", "--sizes", "12", "--backends", "highs,greedy",
                 "--limit", "10", "--out", str(tmp_path)])
    assert code == 0
    rows = [r for r in (tmp_path / "solvers.csv").read_text().splitlines() if not r.startswith("#")]  # header comments: command, load
    header = rows[0].split(",")
    assert header[:4] == ["case", "family", "size", "backend"] and {"status", "wall_s", "gap", "load1"} <= set(header)
    assert len(rows) == 1 + (3 + 2) * 2  # (3 clusters + chain + dag) x 2 backends
    assert (tmp_path / "solvers.png").stat().st_size > 1000
    assert "solver benchmark" in capsys.readouterr().out


# ---- every verb: exit codes per the README's table, never a traceback for bad input ----------------
def _tiny_plan(tmp_path) -> Path:
    out = tmp_path / "plan.json"
    assert main(["solve", TINY, "-o", str(out)]) == 0
    return out


def test_an_import_factory_that_raises_exits_2_naming_it(tmp_path, capsys, monkeypatch):
    (tmp_path / "boom_models.py").write_text("def factory():\n    raise RuntimeError('no weights here')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = tmp_path / "imp.yaml"
    spec.write_text(Path(TINY).read_text().replace("  name: tiny-resnet", '  import: "boom_models:factory"\n'
                                                   "  input_shape: [3, 16, 16]"))
    assert main(["solve", str(spec)]) == 2
    err = capsys.readouterr().err
    assert "model.import: factory 'boom_models:factory' raised RuntimeError: no weights here" in err


def test_an_unknown_backend_exits_2_naming_solver_backend_with_the_full_list(capsys):
    assert main(["solve", TINY, "--backend", "gurobi"]) == 2
    err = capsys.readouterr().err
    assert "solver.backend" in err and "unknown backend 'gurobi'" in err
    assert "highs, cbc, scip, cpsat, greedy, uniform, default" in err


def test_spec_backend_names_are_the_registry_plus_uniform_and_default():
    from qsync_opt.solver.backends import BACKENDS
    from qsync_opt.training.spec import BACKEND_NAMES

    assert set(BACKEND_NAMES) == set(BACKENDS) | {"uniform", "default"}


def test_solve_problem_honours_output_and_json_and_refuses_uniform(tmp_path, capsys):
    p = tmp_path / "p.json"
    assert main(["solve", TINY, "--export-problem", str(p)]) == 0
    capsys.readouterr()
    assert main(["solve", "--problem", str(p), "--backend", "uniform"]) == 2
    assert "--backend: 'uniform' cannot solve a saved problem" in capsys.readouterr().err
    out = tmp_path / "result.json"
    assert main(["solve", "--problem", str(p), "-o", str(out), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads(out.read_text())
    assert printed["status"] == "optimal" and set(printed["assignment"]) == {"native", "sse41"}


def test_train_with_a_plan_of_other_groups_or_unknown_operators_exits_2(tmp_path, capsys):
    plan = _tiny_plan(tmp_path)
    capsys.readouterr()
    other = tmp_path / "other.json"
    other.write_text(plan.read_text().replace('"sse41"', '"gpu"'))
    assert main(["train", TINY, "--plan", str(other)]) == 2
    err = capsys.readouterr().err
    assert f"--plan {other}: solved for groups ['native', 'gpu']" in err
    assert "but this spec's cluster.groups are ['native', 'sse41']" in err
    unknown = tmp_path / "unknown.json"
    unknown.write_text(plan.read_text().replace('"layer1.0.conv1"', '"layer9.conv1"'))
    assert main(["train", TINY, "--plan", str(unknown)]) == 2
    assert "layer9.conv1: no such module in ResNet" in capsys.readouterr().err


def test_a_plan_with_a_precision_the_device_cannot_run_exits_2(tmp_path, capsys):
    plan = Plan.load(_tiny_plan(tmp_path))
    data = plan.model_dump(mode="json")
    data["groups"]["native"]["precisions"] = {k: "fp16" for k in data["groups"]["native"]["precisions"]}
    bad = tmp_path / "fp16.json"
    bad.write_text(json.dumps(data))
    capsys.readouterr()
    assert main(["train", TINY, "--plan", str(bad)]) == 2
    assert "fp16 is not run by device cpu-local's runtime" in capsys.readouterr().err


def test_spec_lists_allowed_values_of_enums_and_presets(capsys):
    assert main(["spec"]) == 0
    out = capsys.readouterr().out
    assert "allowed: highs | cbc | scip | cpsat | greedy | uniform | default" in out
    assert "allowed: auto | training | inference" in out
    assert "ethernet-100g" in out and "fp8_e4m3 | fp8_e5m2" in out


def test_devices_table_spells_precisions_as_specs_and_plans_do(capsys):
    assert main(["devices"]) == 0
    out = capsys.readouterr().out
    assert "fp8_e4m3" in out and "fp8_e5m2" in out


@pytest.mark.parametrize("flag, value", [("--threads", "0"), ("--steps", "0"), ("--checkpoint-every", "-1"),
                                         ("--start-timeout", "0")])
def test_bad_train_options_exit_2_naming_the_option(tmp_path, capsys, flag, value):
    assert main(["train", TINY, "--plan", str(tmp_path / "none.json"), flag, value]) == 2
    assert flag in capsys.readouterr().err
