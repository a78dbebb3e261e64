"""Lexicographic objectives: the first at its optimum, then the other, checked by brute force."""

from __future__ import annotations

import pytest
from solver_cases import exact_params, rel_close

from qsync_opt.errors import InfeasibleError
from qsync_opt.training.program.brute import brute_force
from qsync_opt.training.program.instance import GroupInstance, TrainingInstance
from qsync_opt.training.program.lexicographic import second_instance
from qsync_opt.training.program.random_instances import random_small
from qsync_opt.training.program.solve import solve_instance


def _cases(objective: str, n: int = 12):
    out = []
    for seed in range(200):
        inst = random_small(seed, objective=objective)
        br = brute_force(inst)
        if br.status == "optimal":
            second = brute_force(second_instance(inst, br.objective * (1 + 1e-12)))
            out.append((seed, inst, br, second))
        if len(out) == n:
            break
    return out


@pytest.mark.parametrize("objective", ["iteration_time", "accuracy_degradation"])
@pytest.mark.parametrize("backend", exact_params())
def test_ties_are_broken_by_the_other_objective(backend, objective):
    bad = []
    for seed, inst, br, second in _cases(objective):
        try:
            r = solve_instance(inst, backend=backend, rel_gap=0.0, time_limit_s=20, threads=1)
        except InfeasibleError:
            bad.append(f"seed {seed}: infeasible")
            continue
        ev = r.evaluation
        other = ev.degradation if objective == "iteration_time" else ev.iteration_ms
        if not rel_close(r.objective, br.objective, rel=1e-6, abs_=1e-12):
            bad.append(f"seed {seed}: first objective {r.objective:.9g} != optimum {br.objective:.9g}")
        if not rel_close(other, second.objective, rel=1e-6, abs_=1e-12):
            bad.append(f"seed {seed}: second objective {other:.9g} != its optimum at the first's value {second.objective:.9g}")
    assert not bad, "\n".join(bad)


def test_a_fast_group_is_not_lowered_for_nothing():
    """cpu_tiny's shape: the slow group sets the iteration time at fp32; the fast one must stay at fp32."""
    def group(name, fp32_ms):
        return GroupInstance(name=name, share=0.5, allowed={"a": ("fp32", "int8"), "b": ("fp32", "int8")},
                             time_ms={"a": {"fp32": fp32_ms, "int8": fp32_ms / 2}, "b": {"fp32": fp32_ms, "int8": fp32_ms / 2}},
                             mem_bytes={"a": {"fp32": 0.0, "int8": 0.0}, "b": {"fp32": 0.0, "int8": 0.0}})

    inst = TrainingInstance(groups=(group("fast", 1.0), group("slow", 4.0)),
                            omega={"a": {"fp32": 0.0, "int8": 1e-3}, "b": {"fp32": 0.0, "int8": 1e-3}},
                            objective="iteration_time", max_degradation=2e-3)  # room to lower all four ops
    r = solve_instance(inst, rel_gap=0.0)
    assert r.objective == pytest.approx(4.0)  # slow group at int8 everywhere
    assert r.assignment["slow"] == {"a": "int8", "b": "int8"}
    assert r.assignment["fast"] == {"a": "fp32", "b": "fp32"}
