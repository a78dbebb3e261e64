"""One truth about the runtime boundary: the spec defaults to what the runtime does, the plan records
what it was costed for, and the runtime refuses a plan costed for another."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from qsync_opt.errors import RuntimeSetupError
from qsync_opt.training.plan import GroupPlan, Plan, Provenance, SolverReport
from qsync_opt.runtime.apply import apply_plan, check_boundary
from qsync_opt.runtime.qfunctions import BOUNDARY
from qsync_opt.training.spec import load_spec


def _plan(**extra) -> Plan:
    g = GroupPlan(device="cpu-local", count=1, local_batch=4, precisions={"0": "int8", "1": "fp32"}, compute_ms=1.0,
                  comm_exposed_ms=0.0, iteration_ms=1.0, peak_memory_bytes=1.0, memory_capacity_bytes=1e9, indicator=0.0)
    return Plan(job="j", model="m", objective="accuracy_degradation", groups={"g": g}, iteration_ms=1.0, indicator=0.0,
                solver=SolverReport(backend="t", status="heuristic", objective=0.0, wall_s=0.0),
                provenance=Provenance(spec_digest="d", versions={}), **extra)


def test_runtime_returns_fp32_so_that_is_the_default():
    model = apply_plan(nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 2)), _plan(), "g")
    assert model(torch.randn(3, 8)).dtype == torch.float32  # int8 op in front: fp32 flows on
    assert BOUNDARY == "fp32"
    spec = load_spec({"cluster": {"groups": [{"name": "a", "device": "cpu-local"}]}, "model": {"name": "tiny-cnn"},
                      "training": {"global_batch": 8}})
    assert spec.runtime.boundary == BOUNDARY and _plan().boundary == BOUNDARY


def test_a_plan_costed_for_edge_is_refused_with_the_fix():
    edge = _plan(boundary="edge")
    msg = r"costed for runtime.boundary='edge'.*re-solve the spec with runtime.boundary: fp32"
    with pytest.raises(RuntimeSetupError, match=msg):
        check_boundary(edge)
    with pytest.raises(RuntimeSetupError, match=msg):
        apply_plan(nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 2)), edge, "g")
    check_boundary(_plan())  # fp32: accepted


def test_plan_files_round_trip_the_boundary_and_old_files_read_as_edge(tmp_path):
    for b in ("edge", "fp32"):
        assert Plan.load(_plan(boundary=b).save(tmp_path / f"{b}.json")).boundary == b
    old = json.loads(_plan().to_json())
    del old["boundary"]  # written before plans recorded it: costed for the then-default 'edge'
    (tmp_path / "old.json").write_text(json.dumps(old))
    with pytest.raises(RuntimeSetupError, match="'edge'"):
        check_boundary(Plan.load(tmp_path / "old.json"))


def test_solve_records_the_spec_boundary():
    from qsync_opt import solve

    base = {"cluster": {"groups": [{"name": "a", "device": "cpu-local"}]}, "model": {"name": "tiny-cnn"},
            "training": {"global_batch": 8}, "solver": {"time_limit_s": 5}}
    assert solve(base).boundary == "fp32"
    assert solve({**base, "runtime": {"boundary": "edge"}}).boundary == "edge"


def test_a_plan_costed_for_another_backward_precision_is_refused_before_any_rank_starts(tmp_path, capsys):
    """Like the boundary: solve records runtime.backward_precision, and training under another refuses the plan,
    naming both and the fix (its times were costed for the other); a plan that does not record it is not checked."""
    import yaml

    from qsync_opt import solve
    from qsync_opt.cli.commands import main
    from qsync_opt.training.runtime.trainer import check_backward_precision

    base = {"cluster": {"groups": [{"name": "a", "device": "cpu-local"}]}, "model": {"name": "tiny-cnn"},
            "training": {"global_batch": 8, "steps": 1}, "solver": {"time_limit_s": 5}}
    plan = solve(base)
    assert plan.backward_precision == "bf16"
    assert solve({**base, "runtime": {"backward_precision": "fp32"}}).backward_precision == "fp32"
    other = load_spec({**base, "runtime": {"backward_precision": "fp32"}})
    with pytest.raises(RuntimeSetupError, match=r"costed for runtime.backward_precision='bf16', but the spec runs "
                                                r"'fp32'.*re-solve the spec .* or set runtime.backward_precision: bf16"):
        check_backward_precision(other, plan)
    check_backward_precision(other, _plan())  # a plan that does not say: not checked
    spec_path, plan_path = tmp_path / "spec.yaml", tmp_path / "plan.json"
    spec_path.write_text(yaml.safe_dump({**base, "runtime": {"backward_precision": "fp32"}}))
    plan.save(plan_path)
    metrics = tmp_path / "metrics"
    assert main(["train", str(spec_path), "--plan", str(plan_path), "--metrics-dir", str(metrics)]) == 2
    assert "runtime.backward_precision='bf16'" in capsys.readouterr().err
    assert not list(metrics.glob("rank*.jsonl"))  # no rank started
