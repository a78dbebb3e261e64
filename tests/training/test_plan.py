"""Plans are what schedulers store and the runtime applies: they must round-trip exactly."""

import json

import pytest

from qsync_opt.errors import SpecError
from qsync_opt.training.plan import Baseline, GroupPlan, Plan, Provenance, SolverReport


def make_plan() -> Plan:
    group = dict(
        count=2, local_batch=32, compute_ms=10.5, comm_exposed_ms=1.25, iteration_ms=11.75,
        peak_memory_bytes=3.5e9, memory_capacity_bytes=15e9, indicator=0.125,
    )
    return Plan(
        job="demo",
        model="resnet18",
        objective="accuracy_degradation",
        groups={
            "v100": GroupPlan(device="V100-16GB", precisions={"conv1": "fp32", "fc": "fp32"}, **group),
            "t4": GroupPlan(device="T4", precisions={"conv1": "fp16", "fc": "int8"}, time_bound_ms=11.75, **group),
        },
        iteration_ms=11.75,
        indicator=0.0625,
        solver=SolverReport(backend="highs", status="optimal", objective=0.0625, best_bound=0.0625, gap=0.0, wall_s=0.01),
        baselines={"fp32": Baseline(iteration_ms=20.0, indicator=0.0, peak_memory_bytes={"t4": 4e9}, feasible=True)},
        provenance=Provenance(spec_digest="abc", versions={"qsync_opt": "0.1.0"}),
    )


@pytest.mark.parametrize("suffix", [".json", ".yaml"], ids=["json", "yaml"])
def test_round_trip_through_files(tmp_path, suffix):
    plan = make_plan()
    path = plan.save(tmp_path / f"plan{suffix}")
    assert Plan.load(path) == plan
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "no temp files left behind"


def test_fqn_config_keeps_order_and_values():
    plan = make_plan()
    assert list(plan.to_fqn_config("t4").items()) == [("conv1", "fp16"), ("fc", "int8")]
    assert plan.groups["t4"].counts() == {"fp16": 1, "int8": 1}


def test_unknown_group_lists_known_ones():
    with pytest.raises(SpecError, match="no group 'a100'.*v100, t4"):
        make_plan().to_fqn_config("a100")


def test_wrong_version_is_rejected(tmp_path):
    data = json.loads(make_plan().to_json())
    data["format_version"] = 99
    p = tmp_path / "p.json"
    p.write_text(json.dumps(data))
    with pytest.raises(SpecError, match="format_version 99"):
        Plan.load(p)


def test_bad_precision_in_plan_names_the_field():
    data = json.loads(make_plan().to_json())
    data["groups"]["t4"]["precisions"]["fc"] = "int3"
    with pytest.raises(SpecError, match="groups.t4.precisions.fc"):
        Plan.from_dict(data)
