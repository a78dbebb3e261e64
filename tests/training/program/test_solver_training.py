"""The training compiler: its program means exactly what instance.evaluate means."""

from __future__ import annotations

import math
import random

import pytest

from qsync_opt.errors import SpecError
from qsync_opt.training.program.instance import GroupInstance, TrainingInstance, evaluate, group_time_ms
from qsync_opt.training.program.random_instances import random_small
from qsync_opt.training.program.compile import compile_training


def _random_plan(inst: TrainingInstance, rng: random.Random):
    return {g.name: {op: rng.choice(ps) for op, ps in g.allowed.items()} for g in inst.groups}


@pytest.mark.parametrize("seed", range(0, 120, 3))
def test_program_objective_and_rows_agree_with_evaluate_on_any_plan(seed):
    """For random plans, the compiled objective equals evaluate's and rows hold iff the plan is feasible."""
    inst = random_small(seed)
    p = compile_training(inst)
    rng = random.Random(seed)
    for _ in range(30):
        plan = _random_plan(inst, rng)
        values = p.encode(plan)
        ev = evaluate(inst, plan, rel_tol=0.0)
        assert p.decode(values) == plan
        assert p.objective_value(values) == pytest.approx(_objective(inst, plan), rel=1e-9, abs=1e-12)
        broken = p.violated(values, tol=1e-9)
        assert (not broken) == ev.feasible or _on_the_edge(inst, plan), (broken, ev.violations)


def _objective(inst: TrainingInstance, plan) -> float:
    """Objective from the instance's own formulas (evaluate stops summing after a violation)."""
    if inst.objective == "iteration_time":
        return max(group_time_ms(g, plan[g.name]) for g in inst.groups)
    return sum(g.share * inst.omega[op][p] for g in inst.groups for op, p in plan[g.name].items())


def _on_the_edge(inst, plan) -> bool:
    """Within 1e-6 of a bound: the two tolerances may disagree there."""
    loose = evaluate(inst, plan, rel_tol=1e-6)
    tight = evaluate(inst, plan, rel_tol=-1e-6)
    return loose.feasible != tight.feasible


def _group(**kw) -> GroupInstance:
    base = dict(
        name="t4",
        share=0.5,
        allowed={"blk.0.fc": ("fp32", "fp16", "int8"), "head": ("fp16",)},
        time_ms={"blk.0.fc": {"fp32": 4.0, "fp16": 2.0, "int8": 1.5}, "head": {"fp16": 1.0}},
        mem_bytes={"blk.0.fc": {"fp32": 4e9, "fp16": 2e9, "int8": 1e9}, "head": {"fp16": 5e8}},
        cast_ms={("blk.0.fc", "head"): {("fp32", "fp16"): 0.25, ("int8", "fp16"): 0.5}},
        time_bound_ms=4.0,
        mem_capacity_bytes=8e9,
    )
    base.update(kw)
    return GroupInstance(**base)


OMEGA = {"blk.0.fc": {"fp32": 0.0, "fp16": 0.01, "int8": 0.1}, "head": {"fp16": 0.02}}


def test_names_are_readable_and_fixed_ops_fold_into_constants():
    p = compile_training(TrainingInstance(groups=(_group(),), omega=OMEGA))
    assert set(p.choices) == {"x_t4__blk_0_fc__fp32", "x_t4__blk_0_fc__fp16", "x_t4__blk_0_fc__int8"}
    assert p.choices["x_t4__blk_0_fc__int8"] == ("t4", "blk.0.fc", "int8")
    assert p.fixed == {"t4": {"head": "fp16"}}
    assert not p.pairs  # a cast next to a fixed op is linear in the other op's choice
    time_row = next(c for c in p.constraints if c.name == "time_t4")
    assert time_row.coeffs == {"x_t4__blk_0_fc__fp32": 4.25, "x_t4__blk_0_fc__fp16": 2.0, "x_t4__blk_0_fc__int8": 2.0}
    assert time_row.rhs == 3.0  # 4 ms bound − 1 ms for the fixed head
    mem_row = next(c for c in p.constraints if c.name == "mem_t4")
    scale = mem_row.coeffs["x_t4__blk_0_fc__int8"] / 1e9
    assert math.log2(scale).is_integer()  # rescaled by a power of two: exact
    assert mem_row.rhs == (8e9 - 5e8) * scale


def test_a_fully_fixed_group_adds_no_variables():
    g = _group(allowed={"blk.0.fc": ("fp16",), "head": ("fp16",)})
    p = compile_training(TrainingInstance(groups=(g,), omega=OMEGA))
    assert not p.variables and not p.pairs
    assert p.decode({}) == {"t4": {"blk.0.fc": "fp16", "head": "fp16"}}
    assert p.objective_value({}) == pytest.approx(0.5 * 0.03)


def test_iteration_time_objective_uses_an_epigraph_over_all_groups():
    fast = _group(name="a100", time_bound_ms=None, share=0.5)
    p = compile_training(TrainingInstance(groups=(_group(), fast), omega=OMEGA, objective="iteration_time", max_degradation=0.05))
    assert p.objective == {"T_iteration": 1.0}
    assert {c.name for c in p.constraints} >= {"epi_t4", "epi_a100", "time_t4", "degradation_budget"}


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(time_ms={"blk.0.fc": {"fp32": 4.0, "fp16": 2.0}, "head": {"fp16": 1.0}}),
         r"groups\[t4\]\.time_ms\['blk\.0\.fc'\]\['int8'\]: None; give a finite number for every allowed precision"),
        (dict(allowed={"blk.0.fc": ("fp32", "int3"), "head": ("fp16",)}), r"unknown precision 'int3'; known: fp32"),
        (dict(allowed={"blk.0.fc": (), "head": ("fp16",)}), r"allowed\['blk\.0\.fc'\]: empty; allow at least one precision"),
        (dict(cast_ms={("blk.0.fc", "tail"): {}}), r"op 'tail' is not in this group's ops; drop the edge or add the op"),
        (dict(share=-1.0), r"groups\[t4\]\.share: -1\.0; must be a finite number ≥ 0"),
        (dict(time_bound_ms=math.nan), r"time_bound_ms: nan; give a finite bound or None"),
        (dict(mem_bytes={"blk.0.fc": {"fp32": 1.0, "fp16": math.inf, "int8": 1.0}, "head": {"fp16": 1.0}}),
         r"mem_bytes\['blk\.0\.fc'\]\['fp16'\]: inf"),
    ],
    ids=["missing-time", "bad-precision", "empty-allowed", "bad-edge", "negative-share", "nan-bound", "inf-memory"],
)
def test_bad_instances_name_the_field_value_and_fix(change, message):
    with pytest.raises(SpecError, match=message):
        compile_training(TrainingInstance(groups=(_group(**change),), omega=OMEGA))


def test_instance_level_errors():
    g = _group()
    with pytest.raises(SpecError, match="objective: 'speed' is unknown"):
        compile_training(TrainingInstance(groups=(g,), omega=OMEGA, objective="speed"))
    with pytest.raises(SpecError, match=r"groups\[t4\]: group name used twice"):
        compile_training(TrainingInstance(groups=(g, g), omega=OMEGA))
    with pytest.raises(SpecError, match=r"omega\['blk\.0\.fc'\]\['int8'\]: None"):
        compile_training(TrainingInstance(groups=(g,), omega={**OMEGA, "blk.0.fc": {"fp32": 0.0, "fp16": 0.1}}))
    with pytest.raises(SpecError, match="groups: empty"):
        compile_training(TrainingInstance(groups=(), omega=OMEGA))


def test_names_stay_unique_when_sanitising_collides():
    g = _group(
        allowed={"a.b": ("fp32", "fp16"), "a_b": ("fp32", "fp16"), "head": ("fp16",)},
        time_ms={"a.b": {"fp32": 1.0, "fp16": 0.5}, "a_b": {"fp32": 1.0, "fp16": 0.5}, "head": {"fp16": 1.0}},
        mem_bytes={"a.b": {"fp32": 1.0, "fp16": 0.5}, "a_b": {"fp32": 1.0, "fp16": 0.5}, "head": {"fp16": 1.0}},
        cast_ms={},
    )
    omega = {"a.b": {"fp32": 0.0, "fp16": 1.0}, "a_b": {"fp32": 0.0, "fp16": 2.0}, "head": {"fp16": 0.0}}
    p = compile_training(TrainingInstance(groups=(g,), omega=omega))
    ops = {op for _, op, _ in p.choices.values()}
    assert ops == {"a.b", "a_b"} and len(p.choices) == 4
    assert {v.split("__")[1] for v in p.choices} == {"a_b", "a_b_2"}
