"""The backend-neutral IR: products, their exact linearisation, validation, decode/encode."""

from __future__ import annotations

import itertools

import pytest

from qsync_opt.errors import SolverError
from qsync_opt.solver.backends import SolveOptions, get_backend
from qsync_opt.solver.backends.linear import linearize
from qsync_opt.solver.problem import Problem
from tests.training.program.solver_cases import exact_params


def _two_choices(pair_coef: float, obj_x: dict[str, float]) -> Problem:
    """Two one-hot choices {a0, a1} x {b0, b1} and one product y = a1·b1 in the objective."""
    p = Problem("toy")
    for v in ("a0", "a1", "b0", "b1"):
        p.add_var(v)
    p.add_onehot("A", ["a0", "a1"])
    p.add_onehot("B", ["b0", "b1"])
    p.add_pair("y", "a1", "b1")
    p.objective = {**obj_x, "y": pair_coef}
    return p


def _enumerate(p: Problem) -> float:
    best = float("inf")
    for a, b in itertools.product(("a0", "a1"), ("b0", "b1")):
        vals = p.complete({"a0": a == "a0", "a1": a == "a1", "b0": b == "b0", "b1": b == "b1"})
        if not p.violated(vals):
            best = min(best, p.objective_value(vals))
    return best


@pytest.mark.parametrize("formulation", ["mccormick", "marginal"])
@pytest.mark.parametrize("backend", exact_params())
@pytest.mark.parametrize("pair_coef", [5.0, -5.0], ids=["cost", "reward"])
def test_products_are_exact_whatever_the_sign(backend, formulation, pair_coef):
    # a1 and b1 each cost 1; together they add pair_coef: a reward makes (a1, b1) optimal at -3
    p = _two_choices(pair_coef, {"a1": 1.0, "b1": 1.0})
    r = get_backend(backend).solve(p, SolveOptions(rel_gap=0.0, formulation=formulation))
    assert r.status == "optimal"
    assert r.objective == pytest.approx(_enumerate(p)) == pytest.approx(min(0.0, 2 + pair_coef))


def test_mccormick_adds_upper_rows_only_where_a_product_profits_from_growing():
    cost = linearize(_two_choices(5.0, {}), "mccormick")
    reward = linearize(_two_choices(-5.0, {}), "mccormick")
    assert [c.name for c in cost.constraints] == ["y_lo"]
    assert [c.name for c in reward.constraints] == ["y_lo", "y_ua", "y_ub"]


def test_marginal_builds_the_full_joint_table_once_per_pair_of_choices():
    p = _two_choices(5.0, {})
    p.add_pair("y2", "a0", "b1")  # same two one-hots: shares the table
    lm = linearize(p, "marginal")
    assert sorted(lm.products) == sorted(f"m_{u}__{v}" for u in ("a0", "a1") for v in ("b0", "b1"))
    assert sum(c.sense == "==" for c in lm.constraints) == 4


def test_pair_inside_one_choice_is_the_factor_or_zero():
    p = Problem("self")
    for v in ("a0", "a1"):
        p.add_var(v)
    p.add_onehot("A", ["a0", "a1"])
    p.add_pair("same", "a1", "a1")
    p.add_pair("never", "a0", "a1")
    p.objective = {"a0": 1.0, "same": 3.0, "never": -100.0}
    r = get_backend("highs").solve(p, SolveOptions(rel_gap=0.0))
    assert r.objective == pytest.approx(1.0)  # a0: 1; a1: 3; "never" can never pay out


def test_validation_names_the_unknown_variable():
    p = _two_choices(1.0, {})
    p.add_constraint("row", {"ghost": 1.0}, "<=", 1.0)
    with pytest.raises(SolverError, match="constraint 'row': unknown variable 'ghost'"):
        p.validate()
    with pytest.raises(SolverError, match="declared twice"):
        p.add_var("a0")
    with pytest.raises(SolverError, match="pair 'z' needs binary factors"):
        p.add_var("t", "continuous", 0, 10)
        p.add_pair("z", "a0", "t")
    with pytest.raises(SolverError, match="sense '<' is not one of"):
        p.add_constraint("bad", {"a0": 1.0}, "<", 1.0)
    with pytest.raises(SolverError, match="method 'tight' unknown"):
        linearize(p, "tight")


def test_complete_settles_the_epigraph_at_the_largest_time():
    p = Problem("epi")
    for v in ("x", "z"):
        p.add_var(v)
    p.add_var("T", "continuous", 0.0, float("inf"))
    p.add_constraint("g1", {"x": 4.0, "T": -1.0}, "<=", -1.0)  # T ≥ 1 + 4x
    p.add_constraint("g2", {"z": 2.0, "T": -1.0}, "<=", 0.0)  # T ≥ 2z
    p.objective = {"T": 1.0}
    assert p.complete({"x": 1, "z": 1})["T"] == 5.0
    assert p.complete({"x": 0, "z": 1})["T"] == 2.0


def test_decode_refuses_two_precisions_for_one_op():
    p = Problem("d")
    p.add_var("x1")
    p.add_var("x2")
    p.choices = {"x1": ("g", "op", "fp16"), "x2": ("g", "op", "int8")}
    assert p.decode({"x1": 1.0, "x2": 0.0}) == {"g": {"op": "fp16"}}
    with pytest.raises(SolverError, match="two precisions for g/op"):
        p.decode({"x1": 1.0, "x2": 1.0})


def test_problem_with_every_op_pinned_solves_without_a_backend():
    """All groups training at fp32: no variable is left, and every backend must still answer."""
    from qsync_opt.solver.backends import EXACT
    from qsync_opt.training.program.instance import GroupInstance, TrainingInstance
    from qsync_opt.training.program.solve import solve_instance

    g = GroupInstance(name="a", share=1.0, allowed={"x": ("fp32",)}, time_ms={"x": {"fp32": 2.0}},
                      mem_bytes={"x": {"fp32": 1.0}}, time_bound_ms=3.0, mem_capacity_bytes=10.0)
    inst = TrainingInstance(groups=(g,), omega={"x": {"fp32": 0.0}})
    for backend in (*EXACT, "greedy"):
        r = solve_instance(inst, backend=backend)
        assert r.status == "optimal" and r.assignment == {"a": {"x": "fp32"}}


def test_evaluate_reports_every_group_after_one_breaks_its_bound():
    from qsync_opt.training.program.instance import GroupInstance, TrainingInstance, evaluate

    def group(name, bound):
        return GroupInstance(name=name, share=0.5, allowed={"x": ("fp32", "int8")},
                             time_ms={"x": {"fp32": 2.0, "int8": 1.0}}, mem_bytes={"x": {"fp32": 4.0, "int8": 1.0}},
                             time_bound_ms=bound, mem_capacity_bytes=2.0)
    inst = TrainingInstance(groups=(group("a", 1.5), group("b", 1.5)), omega={"x": {"fp32": 0.0, "int8": 1.0}})
    ev = evaluate(inst, {"a": {"x": "fp32"}, "b": {"x": "fp32"}})
    assert set(ev.time_ms) == {"a", "b"}
    assert sum(v.startswith("b:") for v in ev.violations) == 2  # b's time and memory, not hidden behind a's
    ev = evaluate(inst, {"a": {"x": "fp8_e4m3"}, "b": {"x": "int8"}})
    assert ev.time_ms == {"b": 1.0} and ev.degradation == 0.5
