"""Per-group decomposition: with `minimize: accuracy_degradation` and no indicator budget, the
groups share nothing (each has its own ops, casts, time and memory rows), so the optimum is the
sum of each group's optimum, and a proven bound is the sum of the groups' bounds.

Solving G programs of size n instead of one of size G·n is exact and, since MIP effort grows
faster than linearly, much faster. Groups draw on one Budget in turn, each given an equal share
of what remains; a group that ends without a plan makes the whole call fail as the undivided
solve would (the diagnosis then runs on the whole instance). Each group's solve starts with
the Lagrangian stage (bounded.py) unless the caller turns it off.
"""

from __future__ import annotations

import time

from qsync_opt.errors import InfeasibleError
from qsync_opt.solver.backends.base import OPTIMALITY_TOL, SolveOptions, proven_within
from qsync_opt.solver.budget import Budget
from qsync_opt.training.program.instance import TrainingInstance, evaluate
from qsync_opt.training.program.backend_solve import SolveResult, compiled, solve_problem
from qsync_opt.training.program.bounded import solve_group
from qsync_opt.training.program.diagnose import diagnose


def separable(instance: TrainingInstance) -> bool:
    return (instance.objective == "accuracy_degradation" and instance.max_degradation is None
            and len(instance.groups) > 1)


def solve_by_group(instance: TrainingInstance, backend: str, options: SolveOptions, budget: Budget, warm_start: bool,
                   lagrangian: bool = True):
    """A SolveResult for the whole instance from one exact solve per group.

    With `lagrangian` (and a warm start allowed), each group first gets a Lagrangian bound,
    plan and fixing (bounded.py), and the backend solves only what is left."""

    parts, build0, spent0 = [], budget.build_s, budget.spent_s
    for k, g in enumerate(instance.groups):
        left = len(instance.groups) - k
        sub = TrainingInstance(groups=(g,), omega=instance.omega, objective=instance.objective)
        failed = None
        # an equal share of what remains, charged back whether the group found a plan or not
        with budget.part(budget.remaining() / left, f"group {g.name}") as share:
            try:
                part = solve_group(sub, backend, options, share) if lagrangian and warm_start else None
                parts.append(part or solve_problem(compiled(sub, share), backend, options, warm_start=warm_start,
                                                   budget=share))
            except InfeasibleError as e:
                failed = e
        if failed is not None:  # the diagnosis covers every group, as the undivided solve's would

            raise InfeasibleError(str(failed).splitlines()[0], diagnose(instance, budget=budget) or failed.diagnosis)
    t0 = time.perf_counter()
    assignment = {g: ops for r in parts for g, ops in r.assignment.items()}
    ev = evaluate(instance, assignment)
    budget.charge(time.perf_counter() - t0)
    bounds = [r.bound for r in parts]
    bound = sum(bounds) if all(b is not None for b in bounds) else None
    ok, gap = proven_within(ev.objective(instance), bound, max(options.rel_gap, OPTIMALITY_TOL))
    return SolveResult(
        assignment=assignment,
        status="optimal" if ok else "feasible",
        objective=ev.objective(instance),
        bound=bound,
        gap=gap,
        wall_s=sum(r.wall_s for r in parts),
        backend=backend,
        warm_start_used=any(r.warm_start_used for r in parts),
        scaling=parts[0].scaling,
        evaluation=ev,
        message="; ".join(f"{g.name}: {r.status}" + (f" ({r.message})" if r.message else "")
                          for g, r in zip(instance.groups, parts)) + " (solved per group: separable)",
        problem_stats={k: sum(r.problem_stats.get(k, 0) for r in parts)
                       for k in dict.fromkeys(k for r in parts for k in r.problem_stats)},
        build_s=budget.build_s - build0,  # compiling each group included
        solve_s=budget.spent_s - spent0,
    )

