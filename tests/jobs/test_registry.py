"""Every registered kind answers every verb: `spec`, `solve`, `report`, `run`'s refusals; nothing above the kinds
branches on which kind a job is."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from qsync_opt import jobs
from qsync_opt.cli.commands import main
from qsync_opt.errors import SpecError
from qsync_opt.kind import RUN_FLAGS
from qsync_opt.spec.load import PLAN_MARKS

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "qsync_opt"
KINDS = list(jobs.KINDS)


@pytest.mark.parametrize("name", KINDS)
def test_each_kind_has_an_example_its_model_validates(name):
    k = jobs.KINDS[name]
    assert (ROOT / k.example).is_file(), k.example
    job = jobs.load_spec(ROOT / k.example)
    assert jobs.kind_of_job(job) is k and isinstance(job, k.job_model)


@pytest.mark.parametrize("name", KINDS)
def test_each_kind_is_recognised_as_a_plan_file(name):
    assert name in {kind for kind, _, _ in PLAN_MARKS}


@pytest.mark.parametrize("name", KINDS)
def test_solve_then_report_round_trips_each_kinds_example(name, tmp_path, capsys, monkeypatch):
    """`solve -o` writes a plan that `report` reads back as the same kind's plan and prints as `solve` did."""
    monkeypatch.chdir(ROOT)
    k = jobs.KINDS[name]
    out = tmp_path / "plan.json"
    assert main(["solve", k.example, "-o", str(out)]) == 0
    solved = capsys.readouterr().out
    kind, plan = jobs.load_plan(out)
    assert kind is k
    assert json.loads(plan.to_json()) == json.loads(out.read_text())
    assert main(["report", str(out)]) == 0
    reported = capsys.readouterr().out
    assert reported.strip() and reported.strip() in solved


@pytest.mark.parametrize("name", KINDS)
def test_spec_documents_each_kind_with_its_example(name, capsys):
    assert main(["spec", "--kind", name]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"# kind: {name}") and jobs.KINDS[name].example in out


@pytest.mark.parametrize("name", KINDS)
def test_run_refuses_each_flag_the_kind_does_not_take_naming_it(name, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    k = jobs.KINDS[name]
    values = {"start": ["--from", k.stages[0]], "emulate": ["--emulate"], "real": ["--real"], "rounds": ["--rounds", "2"]}
    refused = [f for f in RUN_FLAGS if f not in k.run_options]
    for field in refused:
        assert main(["run", k.example, "-o", str(tmp_path / "out"), *values[field]]) == 2
        err = capsys.readouterr().err
        assert f"{RUN_FLAGS[field]}: a {name} run does not take it" in err and "Traceback" not in err
        assert not (tmp_path / "out").exists()


def test_export_problem_is_refused_by_kinds_without_one_program(tmp_path):
    for name, k in jobs.KINDS.items():
        if not k.exports_problem:
            with pytest.raises(SpecError, match=f"--export-problem: a {name} plan"):
                jobs.solve(ROOT / k.example, export_problem=tmp_path / "p.json")
    assert not (tmp_path / "p.json").exists()


def test_report_names_a_file_that_is_no_plan(tmp_path, capsys):
    f = tmp_path / "x.json"
    f.write_text('{"a": 1}')
    assert main(["report", str(f)]) == 2
    err = capsys.readouterr().err
    assert "is not a plan of any kind" in err and "Traceback" not in err


def _branches_on_kinds(path: Path) -> list[str]:
    """Comparisons against a kind's name and isinstance checks against a kind's job or plan model."""
    models = {k.job_model.__name__ for k in jobs.KINDS.values()} | {"Plan", "ServingPlan", "RolloutPlan", "LoadingPlan"}
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Compare):
            for c in [node.left, *node.comparators]:
                consts = c.elts if isinstance(c, (ast.Tuple, ast.List, ast.Set)) else [c]
                if any(isinstance(x, ast.Constant) and x.value in jobs.KINDS for x in consts):
                    found.append(f"{path.name}:{node.lineno} compares with a kind name")
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance":
            names = {n.id for n in ast.walk(node.args[1]) if isinstance(n, ast.Name)}
            names |= {n.attr for n in ast.walk(node.args[1]) if isinstance(n, ast.Attribute)}
            if names & models:
                found.append(f"{path.name}:{node.lineno} isinstance on a kind's model")
    return found


def test_jobs_and_cli_do_not_branch_on_kinds():
    files = [PACKAGE / "jobs.py", *sorted((PACKAGE / "cli").glob("*.py"))]
    assert [f for path in files for f in _branches_on_kinds(path)] == []


@pytest.mark.parametrize("name", KINDS)
def test_report_names_a_plan_file_whose_content_is_not_its_kinds_plan(name, tmp_path, capsys):
    """A file that carries a kind's plan keys but not a valid plan: exit 2 naming the file and the kind, no
    traceback (a serving plan's load used to raise pydantic's ValidationError)."""
    keys = next(keys for kind, keys, _ in PLAN_MARKS if kind == name)
    f = tmp_path / "plan.json"
    f.write_text(json.dumps({k: 1 for k in keys}))
    assert main(["report", str(f)]) == 2
    err = capsys.readouterr().err
    assert str(f) in err and "plan" in err and "Traceback" not in err
