"""Plans for devices priced by the calibrated roofline: what they say, and what they never choose."""

from __future__ import annotations

from unittest import mock

import pytest

from predictor_graphs import deep_mlp_graph, flat_omega
from qsync_opt.training.predictor import instance_builder
from qsync_opt.training.predictor.instance_builder import build_instance
from qsync_opt.training.program.brute import brute_force
from qsync_opt.training.program.instance import evaluate
from qsync_opt.training.spec import load_spec

GRAPH = deep_mlp_graph(batch=4096, width=2048, layers=5)  # compute-bound GEMMs, as on a GPU


def _spec(device: str, bound_ms: float | str = "auto", minimize="accuracy_degradation", role="auto") -> str:
    budget = ", max_accuracy_degradation: 8.0" if minimize == "iteration_time" else ""
    return f"""
cluster:
  groups:
    - {{name: gpu, device: {device}, count: 1, role: {role}}}
model: {{name: resnet50}}
training: {{global_batch: 4096, optimizer: adamw}}
objective: {{minimize: {minimize}, max_iteration_time: {bound_ms}{budget}}}
"""


def _build(device, **kw):
    return build_instance(load_spec(_spec(device, **kw)), GRAPH, flat_omega(GRAPH), boundary="fp32")


def test_a_calibrated_group_says_so_and_names_the_measurements():
    _, ctx = _build("H200", bound_ms=10.0)
    src = ctx.group("gpu").cost_source
    assert ctx.group("gpu").cost_kind == "calibrated"
    assert src.startswith("roofline, calibrated: linear ops at fp32, tf32, bf16, fp16")
    assert "sm_90" in src and "benchmarks/results/gpu/h200-gpu-check-results.json" in src
    assert "H200 is not on this machine" in src
    assert any(n.startswith("costs of gpu: roofline, calibrated") for n in ctx.notes)
    _, ctx = _build("A100-80GB", bound_ms=10.0)  # sm_80: nothing measured
    assert ctx.group("gpu").cost_kind == "datasheet"
    assert ctx.group("gpu").cost_source.startswith("roofline, datasheet only (A100-80GB is not on this machine")


def _dominated(ctx, inst, omega, a) -> list[str]:
    """Selected (op, p) for which a higher offered precision q has ω_q ≤ ω_p and costs less."""
    gc, out = ctx.group("gpu"), []
    for op, p in a["gpu"].items():
        t = {q: c.total_ms for q, c in gc.costs[op].items()}
        offered = list(gc.costs[op])
        higher = offered[: offered.index(p)]
        out += [f"{op}: {p} slower than {q}" for q in higher if omega[op][q] <= omega[op][p] and t[q] < t[p]]
    return out


@pytest.mark.parametrize("minimize,bound", [("accuracy_degradation", 6.0), ("accuracy_degradation", 3.5),
                                            ("iteration_time", "auto")])
def test_on_a_calibrated_h200_no_op_runs_at_a_precision_slower_than_a_more_accurate_one(minimize, bound):
    """fp8/int8 linears measured slower than bf16 on sm_90: they are not even offered, and the exact
    optimum (enumerated) never picks a precision slower than a more accurate one."""
    omega = flat_omega(GRAPH)
    inst, ctx = _build("H200", bound_ms=bound, minimize=minimize)
    g = inst.group("gpu")
    for op, ps in g.allowed.items():
        assert not {"fp8_e4m3", "fp8_e5m2", "int8"} & set(ps), (op, ps)
        assert ps[0] == "fp32" and "bf16" in ps
    assert any(n.startswith("gpu: not offered, slower than a more accurate precision") and "int8" in n for n in ctx.notes)
    best = brute_force(inst)
    assert best.status == "optimal"
    assert _dominated(ctx, inst, omega, best.assignment) == []
    assert evaluate(inst, best.assignment).violations == []
    # the program alone (nothing dropped) reaches the same optimum: the drop only removes dead options
    with mock.patch.object(instance_builder, "drop_dominated", lambda gc, om: (gc, "")):
        full, fctx = _build("H200", bound_ms=bound, minimize=minimize)
    assert "int8" in full.group("gpu").allowed["fc0"]
    again = brute_force(full)
    assert again.objective == pytest.approx(best.objective, rel=1e-9)
    assert _dominated(fctx, full, omega, again.assignment) == []


def test_a_datasheet_group_keeps_every_format():
    """T4-style judgement costs are not pruned (instance_builder's docstring says why)."""
    inst, ctx = _build("A100-80GB", bound_ms=10.0)
    assert "int8" in inst.group("gpu").allowed["fc0"]
    assert not any("not offered" in n for n in ctx.notes)


def test_dropped_formats_are_kept_when_the_group_would_not_fit_without_them():
    with mock.patch.object(instance_builder, "drop_dominated", lambda gc, om: (gc, "")):
        _, ctx = _build("H200", bound_ms=10.0)
    gc = ctx.group("gpu")
    pruned, note = instance_builder.drop_dominated(gc, flat_omega(GRAPH))
    assert note.startswith("gpu: not offered") and pruned.allowed != gc.allowed

    def least(allowed):
        return gc.memory.fixed_bytes + sum(min(gc.memory.op_bytes[op][p] for p in ps) for op, ps in allowed.items())

    assert least(gc.allowed) < least(pruned.allowed)  # fp8/int8 store less than what is left
    tight = instance_builder.replace(gc, mem_capacity_bytes=(least(gc.allowed) + least(pruned.allowed)) / 2)
    same, note = instance_builder.drop_dominated(tight, flat_omega(GRAPH))
    assert same is tight and note.startswith("gpu: kept") and "does not fit in memory" in note


def test_the_plan_says_per_group_calibrated_or_datasheet(tmp_path):
    from qsync_opt.training.pipeline import solve
    from qsync_opt.training.plan import Plan

    spec = load_spec("""
cluster:
  groups:
    - {name: h200, device: H200, count: 1}
    - {name: a100, device: A100-80GB, count: 1}
model: {name: tiny-cnn}
training: {global_batch: 64, optimizer: adamw}
indicator: {method: weight}
costs: roofline
objective: {minimize: iteration_time, max_accuracy_degradation: 5%}
""")
    plan = solve(spec)
    assert plan.groups["h200"].cost_source == "calibrated" and plan.groups["a100"].cost_source == "datasheet"
    notes = plan.solver.notes
    assert any(n.startswith("costs of h200: roofline, calibrated: conv ops at") and "h200-gpu-check-results.json" in n
               for n in notes), notes
    assert any(n.startswith("costs of a100: roofline, datasheet only (costs: roofline)") for n in notes), notes
    path = plan.save(tmp_path / "plan.json")
    assert Plan.load(path).groups["h200"].cost_source == "calibrated"
