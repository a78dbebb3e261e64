"""Rank speeds and cost curves from the groups' plans, and the plan's data-plane section
(speeds, c(L), loader workers under the CPU budget) as `qsync-opt solve` shows it."""

from __future__ import annotations

import io
import json

import pytest
import yaml
from rich.console import Console

from qsync_opt.errors import SpecError
from qsync_opt.loading.cost import CostModel
from qsync_opt.loading.speeds import group_speeds, per_rank
from qsync_opt.training.data_plane import model_shape, rank_costs, with_data_plane
from qsync_opt.training.plan import GroupPlan, Plan, Provenance, SolverReport
from qsync_opt.training.report import print_plan
from qsync_opt.training.spec import load_spec


def test_speeds_from_compute_ms_by_hand():
    flops = CostModel(a=6.0, b=12.0)  # FLOPs(10) = 60 + 1200 = 1260
    g = group_speeds(flops, [("fast", 1, 4, 10.0), ("slow", 2, 2, 10.0)], ref_len=10)
    assert g[0].seconds_per_flop == pytest.approx(0.010 / (4 * 1260))
    assert g[1].seconds_per_flop == pytest.approx(0.010 / (2 * 1260))  # half the samples in the same time
    assert [x.speed for x in g] == pytest.approx([1.0, 0.5])
    assert g[1].cost(10) == pytest.approx(0.005) and g[0].cost(10) == pytest.approx(0.0025)  # seconds per sample
    assert g[1].cost.unit == "s" and g[1].cost(20) / g[1].cost(10) == pytest.approx((120 + 4800) / 1260)
    speeds, costs = per_rank(g)
    assert speeds == pytest.approx([1.0, 0.5, 0.5]) and costs[1] is costs[2]
    with pytest.raises(SpecError, match="group 'slow' has local_batch 0"):
        group_speeds(flops, [("fast", 1, 4, 10.0), ("slow", 1, 0, 10.0)], ref_len=10)


SPEC = {
    "name": "dp-plan", "kind": "training",
    "cluster": {"groups": [{"name": "a", "device": "cpu-local", "count": 1},
                           {"name": "b", "device": "cpu-local", "count": 2}], "interconnect": "loopback"},
    "model": {"name": "tiny-gpt2", "kwargs": {"vocab_size": 256, "max_positions": 128}},
    "training": {"global_batch": 12, "steps": 2, "seq_len": 32},
    "data": {"sources": [
        {"name": "short", "builtin": "synthetic-lm", "weight": 3, "kwargs": {"num_samples": 200, "median": 16,
                                                                             "max_len": 64, "vocab": 256}},
        {"name": "long", "builtin": "pysource-lm", "schedule": [[0, 0.0], [100, 2.0]],
         "kwargs": {"median": 60, "min_len": 16, "max_len": 120, "train_bytes": 20000}}],
        "loader_cpus": 3},
}


def _plan(spec, compute):
    groups = {g.name: GroupPlan(device=g.device, count=g.count, local_batch=4, precisions={}, compute_ms=compute[g.name],
                                comm_exposed_ms=0.0, iteration_ms=compute[g.name], peak_memory_bytes=1.0,
                                memory_capacity_bytes=1e9, indicator=0.0) for g in spec.cluster.groups}
    return Plan(job=spec.name, model="tiny-gpt2", objective="accuracy_degradation", groups=groups,
                iteration_ms=max(compute.values()), indicator=0.0,
                solver=SolverReport(backend="test", status="heuristic", objective=0.0, wall_s=0.0),
                provenance=Provenance(spec_digest=spec.digest(), versions={}))


def test_plan_states_speeds_costs_and_loader_workers(tmp_path):
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(SPEC))
    spec = load_spec(tmp_path / "s.yaml")
    plan = with_data_plane(spec, _plan(spec, {"a": 20.0, "b": 50.0}))
    dp = plan.data_plane
    assert dp.groups["a"].speed == 1.0 and dp.groups["b"].speed == pytest.approx(0.4)
    # the curve is the model's FLOPs: tiny-gpt2 has 2 layers of width 64
    from qsync_opt.models.zoo import build_model

    assert model_shape(build_model("tiny-gpt2", vocab_size=256, max_positions=128)) == (2, 64)
    assert dp.flops_b == 12 * 2 * 64
    g = dp.groups["a"]
    assert (g.a * 32 + g.b * 32 ** 2) * 4 == pytest.approx(0.020)  # the group's batch at L0 = its compute_ms
    # loader sizing within the CPU budget, one worker at least per source that feeds the mix
    assert dp.loader_cpus == 3 and set(dp.loader_workers) == {"short", "long"}
    assert 2 <= sum(dp.loader_workers.values()) <= 3 and min(dp.loader_workers.values()) >= 1
    assert dp.demand_samples_per_s["long"] == pytest.approx(12 / 0.050 * 0.4)  # peak share 2/5 at step 100
    # in rank order for the coordinator, the plan's figures as written
    speeds, costs, _ = rank_costs(spec, plan)
    assert speeds == pytest.approx([1.0, 0.4, 0.4]) and costs[1].b == pytest.approx(dp.groups["b"].b)
    # the plan file keeps it, and a plan without it has no key
    again = Plan.from_dict(json.loads(plan.to_json()))
    assert again.data_plane == dp
    assert "data_plane" not in json.loads(_plan(spec, {"a": 20.0, "b": 50.0}).to_json())
    out = io.StringIO()
    print_plan(plan, Console(file=out, width=160))
    text = out.getvalue()
    assert "rank speeds from the plan" in text and "loader workers within 3 CPUs" in text
    assert "0.400" in text and "long" in text


def test_loader_cpus_must_be_positive(tmp_path):
    bad = json.loads(json.dumps(SPEC))
    bad["data"]["loader_cpus"] = 0
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(bad))
    with pytest.raises(SpecError, match="loader_cpus"):
        load_spec(tmp_path / "s.yaml")
