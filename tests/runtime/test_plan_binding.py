"""Plans bind to their model (graph fingerprint) and to what the device's runtime can run."""

from __future__ import annotations

import pytest
from rt_jobs import make_plan, write_spec

from qsync_opt.errors import RuntimeSetupError
from qsync_opt.models.tracing import trace
from qsync_opt.models.zoo import ZOO, build_model
from qsync_opt.training.plan import Plan, graph_fingerprint
from qsync_opt.runtime import apply_plan, current_precisions, selectable_modules
from qsync_opt.runtime.apply import module_fingerprint_ops
from qsync_opt.training.runtime.launch import validate


def _fingerprint(name):
    model = build_model(name)
    inputs = ZOO[name].example_inputs(2)
    return model, graph_fingerprint(trace(model, inputs, model_name=name))


@pytest.mark.parametrize("name", ["tiny-resnet", "tiny-bert", "tiny-cnn"])
def test_the_traced_graph_and_the_module_give_the_same_fingerprint(name):
    model, fp = _fingerprint(name)
    have = module_fingerprint_ops(model)
    assert {k: v for k, v in fp.ops.items() if k in have} == have


def _plan_for(name, tmp_path) -> Plan:
    spec = write_spec(tmp_path / "spec.yaml", model=name)
    model, fp = _fingerprint(name)
    names = list(selectable_modules(model))
    plan = make_plan(spec, {"fast": {n: "int8" for n in names}, "slow": {n: "int8" for n in names}})
    return Plan.model_validate({**plan.model_dump(), "fingerprint": fp.model_dump()})


def test_a_plan_for_another_model_with_overlapping_names_is_refused(tmp_path):
    """The issue's case: a tiny-resnet plan on resnet18 applied 13 entries and left 8 at fp32."""
    plan = _plan_for("tiny-resnet", tmp_path)
    target = build_model("resnet18")
    assert set(plan.groups["fast"].precisions) < set(selectable_modules(target)), "names do overlap"
    with pytest.raises(RuntimeSetupError, match=r"operator 'conv1' is conv2d\[64,3,7,7\] in the model but "
                                                 r"conv2d\[8,3,3,3\] in the plan.*force=True"):
        apply_plan(target, plan, "fast")
    assert set(current_precisions(target).values()) == {"fp32"}, "nothing was touched"
    apply_plan(target, plan, "fast", force=True)  # the user insists
    assert list(current_precisions(target).values()).count("int8") == len(plan.groups["fast"].precisions)


def test_a_plan_for_its_own_model_applies(tmp_path):
    plan = _plan_for("tiny-resnet", tmp_path)
    model = apply_plan(build_model("tiny-resnet"), plan, "fast")
    assert set(current_precisions(model).values()) == {"int8"}


def test_a_plan_missing_an_operator_of_the_model_is_refused(tmp_path):
    plan = _plan_for("tiny-resnet", tmp_path)
    ops = dict(plan.fingerprint.ops)
    dropped = next(iter(ops))
    ops.pop(dropped)
    from qsync_opt.training.plan import make_fingerprint

    other = Plan.model_validate({**plan.model_dump(), "fingerprint": make_fingerprint(ops).model_dump()})
    with pytest.raises(RuntimeSetupError, match=f"operator '{dropped}' .* is in the model but not in the plan's graph"):
        apply_plan(build_model("tiny-resnet"), other, "fast")


def test_a_precision_the_device_runtime_cannot_run_is_refused_before_launch(tmp_path):
    """fp16 on cpu-local: the catalog gives that CPU no fp16 path, so the plan must not train."""
    spec = write_spec(tmp_path / "spec.yaml", model="tiny-cnn")
    names = list(selectable_modules(build_model("tiny-cnn")))
    plan = make_plan(spec, {"fast": {n: "fp16" for n in names}, "slow": {n: "int8" for n in names}})
    with pytest.raises(RuntimeSetupError, match=r"plan group 'fast' asks for precisions its device cpu-local "
                                                 r"cannot run:\n  - .*fp16 is not run by device cpu-local"):
        validate(spec, plan)


def test_pipeline_plans_carry_the_fingerprint_of_their_graph():
    from qsync_opt.training.pipeline import solve

    from pathlib import Path

    plan = solve(Path(__file__).resolve().parents[2] / "examples" / "cpu_tiny.yaml")
    _, fp = _fingerprint("tiny-resnet")
    assert plan.fingerprint == fp
    assert Plan.model_validate_json(plan.to_json()).fingerprint == fp


def test_apply_plan_with_a_device_refuses_what_its_runtime_cannot_run():
    from qsync_opt.hardware.device import find_device

    model = build_model("tiny-cnn")
    names = list(selectable_modules(model))
    with pytest.raises(RuntimeSetupError, match="fp16 is not run by device cpu-noamx's runtime"):
        apply_plan(model, {names[0]: "fp16"}, device=find_device("cpu-noamx"))
    apply_plan(model, {names[0]: "int4"}, device=find_device("cpu-noamx"))  # emulated through the int8 GEMM
    apply_plan(model, {names[1]: "fp16"}, device=find_device("T4"))


def test_weightless_stand_ins_for_functional_ops_are_checked_by_kind():
    from qsync_opt.training.plan import fingerprint_mismatch, make_fingerprint

    plan = make_fingerprint({"root.bmm_0": "bmm[]", "root.linear_0": "linear[32,16]", "fc": "linear[10,32]"})
    model = {"root.bmm_0": "matmul[]", "root.linear_0": "linear[]", "fc": "linear[10,32]"}
    assert fingerprint_mismatch(plan, model) is None
    wrong_kind = {**model, "root.linear_0": "conv2d[]"}
    assert "root.linear_0" in fingerprint_mismatch(plan, wrong_kind)
    wrong_shape = {**model, "fc": "linear[10,64]"}
    assert "'fc' is linear[10,64] in the model but linear[10,32]" in fingerprint_mismatch(plan, wrong_shape)
