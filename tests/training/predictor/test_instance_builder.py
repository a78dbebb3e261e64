"""build_instance: roles and bounds, allowed formats, shares, capacity, baselines, errors."""

from __future__ import annotations

from dataclasses import replace

import pytest

from predictor_graphs import SPEC_V100_T4, conv_chain_graph, flat_omega
from qsync_opt.errors import SpecError
from qsync_opt.training.predictor.instance_builder import baseline, build_instance
from qsync_opt.training.predictor.memory import capacity_bytes
from qsync_opt.training.predictor.replayer import replay
from qsync_opt.training.program.instance import evaluate
from qsync_opt.training.spec import load_spec

GRAPH = conv_chain_graph(batch=8, c=64, hw=56)


def _build(spec_text=SPEC_V100_T4, **overrides):
    return build_instance(load_spec(spec_text, **overrides), GRAPH, flat_omega(GRAPH))


def test_auto_bound_is_the_training_groups_own_time_on_the_lockstep_clock():
    inst, ctx = _build()
    v100, t4 = inst.group("v100"), inst.group("t4")
    assert ctx.training_groups == ("v100",)  # the T4s are far slower at fp32
    assert set(v100.allowed.values()) == {("fp32",)} and v100.time_bound_ms is None
    assert set(t4.allowed.values()) == {("fp32", "fp16", "int8", "int4")}
    # the V100s alone on the shared clock: their all-reduces end at `end`, then every group steps its
    # optimizer, the T4's (slower) included: max(own compute, last all-reduce + slowest optimizer)
    gv, gt = ctx.group("v100"), ctx.group("t4")
    alone = replay(replace(ctx, groups=(gv,)), {"v100": gv.highest})
    own = alone.groups["v100"]
    end = alone.bucket_ends[-1]
    expect = max(own.compute_ms, end + max(gv.optimizer_ms, gt.optimizer_ms))
    assert gt.optimizer_ms > gv.optimizer_ms and expect > own.iteration_ms
    assert t4.time_bound_ms == pytest.approx(expect, rel=1e-12) == pytest.approx(ctx.time_bound_ms, rel=1e-12)
    ev = evaluate(inst, baseline(inst, "highest"))
    assert ev.time_ms["v100"] == pytest.approx(expect, rel=1e-12)
    assert any(v.startswith("t4: time") for v in ev.violations)  # the straggler QSync fixes


def test_shares_capacity_objective_and_indicator():
    inst, ctx = _build()
    assert [g.share for g in inst.groups] == [0.5, 0.5]  # 2 x 16 of 64 each
    assert inst.group("t4").mem_capacity_bytes == pytest.approx(capacity_bytes(16e9))
    assert inst.group("v100").mem_capacity_bytes == pytest.approx(capacity_bytes(32e9))
    assert inst.objective == "accuracy_degradation" and inst.max_degradation is None
    assert set(inst.omega) == {"conv1", "conv2", "conv3"}
    assert ctx.cost_source == "roofline" and ctx.group("t4").local_batch == 16
    assert ctx.group("t4").graph.batch_size == 16
    assert inst.group("t4").cast_ms[("conv1", "conv2")][("fp32", "fp16")] > 0


def test_instance_times_are_op_plus_followers_plus_fixed():
    inst, ctx = _build()
    t4, gc = inst.group("t4"), ctx.group("t4")
    # conv2 is followed by bn2 and relu2, which run in conv2's activation format
    expect = gc.costs["conv2"]["fp16"].total_ms + gc.other_costs["bn2"]["fp16"].total_ms + gc.other_costs["relu2"]["fp16"].total_ms
    assert t4.time_ms["conv2"]["fp16"] == pytest.approx(expect)
    int8 = gc.costs["conv2"]["int8"].total_ms + gc.other_costs["bn2"]["fp16"].total_ms + gc.other_costs["relu2"]["fp16"].total_ms
    assert t4.time_ms["conv2"]["int8"] == pytest.approx(int8)  # T4 backward precision resolves to fp16


def test_a_number_bounds_every_group():
    inst, ctx = _build(**{"objective.max_iteration_time": 50.0})
    assert {g.time_bound_ms for g in inst.groups} == {50.0}
    assert len(inst.group("v100").allowed["conv1"]) > 1  # role auto: free to choose under a number


def test_declared_training_groups_stay_at_highest_under_a_number():
    spec = load_spec(SPEC_V100_T4.replace("{name: v100, device: V100-32GB, count: 2}",
                                          "{name: v100, device: V100-32GB, count: 2, role: training}"),
                     **{"objective.max_iteration_time": 50.0})
    inst, _ = build_instance(spec, GRAPH, flat_omega(GRAPH))
    assert set(inst.group("v100").allowed.values()) == {("fp32",)}
    assert inst.group("v100").time_bound_ms == 50.0


def test_equal_groups_are_all_training():
    spec = SPEC_V100_T4.replace("device: T4", "device: V100-16GB")
    inst, ctx = _build(spec)
    assert ctx.training_groups == ("v100", "t4")
    assert all(g.time_bound_ms is None for g in inst.groups)


def test_all_inference_with_auto_bound_is_a_spec_error():
    spec = SPEC_V100_T4.replace("count: 2}", "count: 2, role: inference}")
    with pytest.raises(SpecError, match="max_iteration_time: 'auto' needs a training group"):
        _build(spec)


def test_group_precisions_restrict_allowed():
    spec = SPEC_V100_T4.replace("{name: t4, device: T4, count: 2}", "{name: t4, device: T4, count: 2, precisions: [fp32, int8]}")
    inst, _ = _build(spec)
    assert set(inst.group("t4").allowed.values()) == {("fp32", "int8")}


def test_missing_indicator_names_the_op_and_the_formats():
    omega = flat_omega(GRAPH, ("fp32", "fp16"))
    with pytest.raises(SpecError, match=r"no ω for op 'conv1' at \['int8', 'int4'\].*group 't4'"):
        build_instance(load_spec(SPEC_V100_T4), GRAPH, omega)


def test_local_batches_override_and_check():
    inst, ctx = build_instance(load_spec(SPEC_V100_T4), GRAPH, flat_omega(GRAPH), local_batches={"v100": 20, "t4": 12})
    assert [g.share for g in inst.groups] == [40 / 64, 24 / 64]
    assert ctx.group("t4").graph.batch_size == 12
    with pytest.raises(SpecError, match=r"local_batches: no batch for group\(s\) \['t4'\]"):
        build_instance(load_spec(SPEC_V100_T4), GRAPH, flat_omega(GRAPH), local_batches={"v100": 32})
    with pytest.raises(SpecError, match="boundary: got 'none'"):
        build_instance(load_spec(SPEC_V100_T4), GRAPH, flat_omega(GRAPH), boundary="none")


def test_baselines():
    inst, _ = _build()
    hi, lo = baseline(inst, "highest"), baseline(inst, "lowest")
    assert set(hi["t4"].values()) == {"fp32"} and set(lo["t4"].values()) == {"int4"}
    assert set(lo["v100"].values()) == {"fp32"}  # the training group has only its highest
    assert evaluate(inst, lo).time_ms["t4"] < evaluate(inst, hi).time_ms["t4"]
    with pytest.raises(SpecError, match="baseline kind: got 'fastest'; use one of highest, lowest"):
        baseline(inst, "fastest")


def test_zoo_model_end_to_end():
    zoo = pytest.importorskip("qsync_opt.models.zoo", reason="model zoo not available")
    from qsync_opt.models.tracing import trace
    from qsync_opt.training.predictor.indicator import weight_indicator

    model = zoo.build_model("tiny-resnet")
    graph = trace(model, zoo.ZOO["tiny-resnet"].example_inputs(8), model_name="tiny-resnet")
    sens = weight_indicator(model, graph, ("fp32", "fp16", "int8", "int4"))
    inst, ctx = build_instance(load_spec(SPEC_V100_T4), graph, sens)
    assert set(inst.group("t4").allowed) == {n.name for n in graph.selectable}
    hi = evaluate(inst, baseline(inst, "highest"))
    fp16 = {**baseline(inst, "highest"), "t4": {op: "fp16" for op in inst.group("t4").allowed}}
    assert evaluate(inst, fp16).time_ms["t4"] < hi.time_ms["t4"]
    assert evaluate(inst, fp16).degradation > hi.degradation == 0.0
