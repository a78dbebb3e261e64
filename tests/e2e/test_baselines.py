"""Every baseline in a plan is trainable (it carries its precision map) and on the plan's indicator scale."""

from __future__ import annotations

import pytest
import torch

from qsync_opt.training.baselines import baseline_plan
from qsync_opt.errors import SpecError
from qsync_opt.models.from_spec import build_from_spec
from qsync_opt.training.pipeline import solve
from qsync_opt.runtime.apply import apply_plan
from qsync_opt.training.spec import load_spec

SPEC = {
    "cluster": {"groups": [{"name": "v100", "device": "V100-32GB", "role": "training", "local_batch": 3072},
                           {"name": "t4", "device": "T4", "role": "inference", "local_batch": 1024}],
                "interconnect": "ethernet-100g"},
    "model": {"name": "tiny-cnn"},
    "training": {"global_batch": 4096, "seed": 1},
    "solver": {"time_limit_s": 10},
}


@pytest.fixture(scope="module")
def plan():
    return solve(load_spec(SPEC))


def test_baselines_are_named_honestly(plan):
    assert {"all highest (fp32)", "uniform lowest", "qsync greedy (QSync allocator)"} <= set(plan.baselines)
    assert "greedy (QSync allocator)" not in plan.baselines  # our own greedy is not QSync's


def test_each_baseline_carries_a_full_precision_map_on_the_plans_scale(plan):
    share = {n: g.local_batch * g.count / 4096 for n, g in plan.groups.items()}
    # the plan's own figures: total = share-weighted sum of the (unweighted) group indicators
    assert plan.indicator == pytest.approx(sum(share[n] * g.indicator for n, g in plan.groups.items()), rel=1e-9)
    for name, b in plan.baselines.items():
        assert set(b.precisions) == set(plan.groups), name
        for g, gp in plan.groups.items():
            assert set(b.precisions[g]) == set(gp.precisions), (name, g)
        assert b.indicator == pytest.approx(sum(share[n] * b.group_indicator[n] for n in plan.groups), rel=1e-9), name
    low = plan.baselines["uniform lowest"].precisions["t4"]
    assert set(low.values()) == {"int4"}  # the T4's lowest format
    assert set(plan.baselines["all highest (fp32)"].precisions["t4"].values()) == {"fp32"}
    assert set(plan.baselines["qsync greedy (QSync allocator)"].precisions["t4"].values()) <= {"fp16", "fp32"}


def test_a_baseline_becomes_a_plan_that_applies(plan):
    low = baseline_plan(plan, "uniform lowest")
    assert low.groups["t4"].precisions == plan.baselines["uniform lowest"].precisions["t4"]
    assert low.indicator == plan.baselines["uniform lowest"].indicator
    torch.manual_seed(0)
    model = apply_plan(build_from_spec(load_spec(SPEC)), low, "t4")
    assert {m.recipe.precision for m in model.modules() if hasattr(m, "recipe")} == {"int4"}
    with pytest.raises(SpecError, match=r"baseline 'uniform lowst' is not in the plan.*did you mean 'uniform lowest'"):
        baseline_plan(plan, "uniform lowst")
