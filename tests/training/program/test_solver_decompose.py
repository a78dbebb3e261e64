"""Per-group decomposition is exact: the same optimum as brute force and as the undivided program."""

from __future__ import annotations

import pytest
from solver_cases import exact_params, optimum_and_bound_mismatches

from qsync_opt.solver.budget import Budget
from qsync_opt.training.program.decompose import separable
from qsync_opt.training.program.random_instances import random_small, synthetic
from qsync_opt.training.program.solve import solve_instance


@pytest.mark.parametrize("backend", exact_params())
def test_per_group_optimum_equals_brute_force(backend, small_cases):
    cases = [c for c in small_cases if separable(c[1])][:40]
    assert len(cases) >= 20
    bad = optimum_and_bound_mismatches(backend, cases, time_limit_s=20)
    assert not bad, "\n".join(bad)


def test_per_group_equals_the_undivided_program_and_shares_the_budget():
    inst = synthetic(25, 4, 3, "dag", seed=2)
    assert separable(inst) and not separable(random_small(0, objective="iteration_time"))
    budget = Budget(60.0)
    split = solve_instance(inst, rel_gap=0.0, tie_break=False, budget=budget, lagrangian=False)
    whole = solve_instance(inst, rel_gap=0.0, tie_break=False, decompose=False)
    assert split.status == whole.status == "optimal"
    assert split.objective == pytest.approx(whole.objective, rel=1e-9)
    assert "solved per group" in split.message
    assert [label.split(":")[0] for label, _, _ in budget.grants] == [f"group {g.name}" for g in inst.groups]
    for _, given, left in budget.grants:
        assert given <= left + 1e-12


def test_per_group_with_the_lagrangian_first_keeps_the_optimum_and_the_budget():
    inst = synthetic(25, 4, 3, "dag", seed=2)
    budget = Budget(60.0)
    lag = solve_instance(inst, rel_gap=0.0, tie_break=False, budget=budget)
    whole = solve_instance(inst, rel_gap=0.0, tie_break=False, decompose=False)
    assert lag.status == whole.status == "optimal"
    assert lag.objective == pytest.approx(whole.objective, rel=1e-9)
    assert lag.bound <= whole.objective * (1 + 1e-9)
    assert "Lagrangian" in lag.message
    names = [g.name for g in inst.groups]
    groups = [label.split(":")[0].removeprefix("group ") for label, _, _ in budget.grants]
    assert set(groups) == set(names) and groups == sorted(groups, key=names.index)
    for _, given, left in budget.grants:
        assert given <= left + 1e-12
