"""Every op the planner may select can be applied: functional GEMMs in a user's model are
rewritten into modules at the planner's FQNs. Per form: import a model -> solve -> apply_plan -> train 5 steps."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from qsync_opt.models.from_spec import build_from_spec
from qsync_opt.models.rewrite import applicable_model
from qsync_opt.training.pipeline import solve
from qsync_opt.runtime.apply import apply_plan, current_precisions
from qsync_opt.training.spec import load_spec

FORMS = [  # factory, the planner's name for the functional op
    ("matmul_net", "root.matmul_0"),
    ("at_net", "root.matmul_1"),
    ("bmm_net", "root.bmm_0"),
    ("linear_net", "root.linear_0"),
    ("conv2d_net", "block.conv2d_0"),
]


def spec_for(factory: str):
    return load_spec({
        "cluster": {"groups": [{"name": "fast", "device": "cpu-local", "role": "training"},
                               {"name": "slow", "device": "cpu-noamx"}], "interconnect": "loopback"},
        "model": {"import": f"user_models:{factory}", "input_shape": [16]},
        "training": {"global_batch": 32, "optimizer": "adam", "lr": 0.01, "seed": 4},
        "solver": {"time_limit_s": 10},
    })


@pytest.mark.parametrize("factory, fqn", FORMS, ids=[f for f, _ in FORMS])
def test_functional_op_is_planned_applied_and_trained(factory, fqn):
    spec = spec_for(factory)
    plan = solve(spec)
    assert fqn in plan.groups["slow"].precisions  # the planner selected the functional op ...
    torch.manual_seed(0)
    original = build_from_spec(spec)
    x = torch.randn(32, 16)
    expected = original(x)
    model = applicable_model(original, spec, plan)
    assert fqn in dict(model.named_modules())  # ... and the runtime now has a module at that FQN
    assert torch.equal(model(x), expected)  # rewriting changes nothing numerically
    model = apply_plan(model, plan, "slow")
    assert current_precisions(model)[fqn] == plan.groups["slow"].precisions[fqn]
    model = apply_plan(model, {fqn: "int8"})  # and it really runs quantized when asked
    assert current_precisions(model)[fqn] == "int8"
    y = torch.randint(0, 10, (32,))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    losses = []
    for _ in range(5):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0]
    moved = [n for n, p in model.named_parameters() if not torch.equal(p, params[n])]
    assert set(moved) == set(params)  # the functional op's own weight learns too
    assert set(model.state_dict()) <= set(original.state_dict())  # checkpoints keep the user's names


def test_rewrite_leaves_models_without_functional_entries_alone():
    spec = spec_for("linear_net")
    m = build_from_spec(spec)
    assert applicable_model(m, spec, {"head": "int8"}) is m


@pytest.mark.slow
def test_two_ranks_train_a_functional_model_with_its_plan(tmp_path, monkeypatch):
    """The launcher's dry run and every rank rewrite the model the same way before applying the plan."""
    import json
    from pathlib import Path

    import yaml

    from qsync_opt.training.plan import Plan
    from qsync_opt.training.runtime.launch import run_job

    monkeypatch.chdir(tmp_path)  # user_models is found beside the spec, not through the cwd
    folder = tmp_path / "job"
    folder.mkdir()
    (folder / "user_models.py").write_text((Path(__file__).parent / "user_models.py").read_text())
    data = spec_for("at_net").model_dump(mode="json", by_alias=True, exclude_defaults=True)
    data["cluster"]["groups"][0]["local_batch"], data["cluster"]["groups"][1]["local_batch"] = 20, 12
    data["data"] = {"name": "digits", "input_shape": [64]}
    data["model"].update(input_shape=[64], kwargs={"d_in": 64})
    (folder / "s.yaml").write_text(yaml.safe_dump(data))
    monkeypatch.syspath_prepend(str(folder))  # for solve() in this process only
    plan = solve(str(folder / "s.yaml"))
    raw = json.loads(plan.to_json())
    raw["groups"]["slow"]["precisions"].update({"root.matmul_0": "int8", "root.matmul_1": "bf16"})
    plan = Plan.from_dict(raw)
    result = run_job(str(folder / "s.yaml"), plan, steps=5, metrics_dir=str(tmp_path / "m"), timeout_s=300)
    assert result.ok and result.steps_done == 5
    start = [json.loads(line) for line in (tmp_path / "m" / "rank1.jsonl").read_text().splitlines()][0]
    assert start["precisions"].get("int8", 0) >= 1 and start["precisions"].get("bf16", 0) >= 1
