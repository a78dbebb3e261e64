"""Lexicographic objectives: the first objective at its value, then the other one.

min-max has flat directions: with `minimize: iteration_time`, a group that is not the slowest
can be lowered to any precision at no cost, and a solver may do it (examples/cpu_tiny.yaml's
plan lowered the fast group for nothing). A second solve fixes the first objective at the
value found (every group within that iteration time, or the indicator within that sum) and
minimises the other, warm-started from the first plan, which stays the fallback.
"""

from __future__ import annotations

from dataclasses import replace

from qsync_opt.errors import QSyncError
from qsync_opt.solver.backends.base import OPTIMALITY_TOL, SolveOptions
from qsync_opt.solver.budget import Budget
from qsync_opt.training.program.instance import TrainingInstance, evaluate
from qsync_opt.training.program.backend_solve import compiled, solve_problem


def second_instance(instance: TrainingInstance, value: float) -> TrainingInstance:
    """`instance` with its objective held at `value` and the other objective minimised."""
    if instance.objective == "iteration_time":
        groups = tuple(replace(g, time_bound_ms=value if g.time_bound_ms is None else min(g.time_bound_ms, value))
                       for g in instance.groups)
        return replace(instance, groups=groups, objective="accuracy_degradation")
    budget = value if instance.max_degradation is None else min(instance.max_degradation, value)
    return replace(instance, objective="iteration_time", max_degradation=budget)


def tie_break(instance: TrainingInstance, first, backend: str, options: SolveOptions, budget: Budget):
    """`first` (a SolveResult), or the tie-broken plan when it keeps the first objective's value."""

    def note(text: str):
        return replace(first, message=f"{first.message}; {text}".strip("; "))

    if budget.exhausted:
        return note("tie-break skipped: the time limit was spent")
    second = second_instance(instance, first.objective)
    try:
        r = solve_problem(compiled(second, budget), backend, options, budget=budget, start=first.assignment)
    except QSyncError as e:  # no time, or numerical trouble at the held value: the first plan stands
        return note(f"tie-break skipped: {str(e).splitlines()[0]}")
    ev = evaluate(instance, r.assignment)
    keep = first.objective + OPTIMALITY_TOL * abs(first.objective)  # relative only: indicators reach 1e-11
    if not ev.feasible or ev.objective(instance) > keep:
        return note("tie-break plan did not hold the first objective; first plan kept")
    other = "indicator" if instance.objective == "iteration_time" else "iteration time"
    return replace(
        first,
        assignment=r.assignment,
        objective=ev.objective(instance),
        evaluation=ev,
        build_s=first.build_s + r.build_s,
        solve_s=first.solve_s + r.solve_s,
        wall_s=first.wall_s + r.wall_s,
        message=f"{first.message}; ties broken by the {other} ({r.status})".strip("; "),
    )
