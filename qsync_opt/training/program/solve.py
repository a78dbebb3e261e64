"""solve_instance: TrainingInstance -> checked plan, or an infeasibility diagnosis.

compile -> (greedy warm start) -> backend -> sign -> decode -> instance.evaluate. The
reported objective is always evaluate's, computed from the instance alone; a backend plan
that evaluate finds in breach of a bound is an error, never a result. `sign` decides the
status from facts in plan units only (the true gap against a bound that holds for the real
program), so no backend's own word, nor a scaled copy's, reaches the user unchecked.
"""

from __future__ import annotations

from qsync_opt.solver.backends import EXACT
from qsync_opt.solver.backends.base import OPTIMALITY_TOL, SolveOptions
from qsync_opt.solver.budget import DEFAULT_TIME_LIMIT_S, Budget
from qsync_opt.training.program.backend_solve import (  # noqa: F401 (re-exported)
    CHECK_S_PER_VARIABLE, DEFAULT_BACKEND, GREEDY_ALWAYS_CHOICES, POST_S_PER_VARIABLE, WARM_START_SHARE, SolveResult,
    compiled, sign, solve_problem)
from qsync_opt.training.program.bounded import applies
from qsync_opt.training.program.decompose import separable, solve_by_group
from qsync_opt.training.program.diagnose import diagnose
from qsync_opt.training.program.instance import TrainingInstance
from qsync_opt.training.program.lexicographic import tie_break as second_objective

__all__ = ["DEFAULT_BACKEND", "OPTIMALITY_TOL", "SolveResult", "diagnose", "sign", "solve_instance", "solve_problem"]


def solve_instance(
    instance: TrainingInstance,
    backend: str = DEFAULT_BACKEND,
    time_limit_s: float | None = None,
    rel_gap: float = 1e-4,
    threads: int | None = None,
    seed: int = 0,
    warm_start: bool = True,
    formulation: str = "mccormick",
    tie_break: bool = True,
    budget: Budget | None = None,
    decompose: bool = True,
    lagrangian: bool = True,
) -> SolveResult:
    """The best plan `backend` finds within the limits; InfeasibleError (with diagnosis) if none exists.

    With `tie_break`, a second solve keeps the first objective at its value and optimises the
    other one (iteration time -> indicator, indicator -> iteration time), so no group is lowered
    for nothing; it shares the time limit and is skipped, with a note, when none is left.
    With `decompose`, a separable instance (decompose.py) is solved one group at a time; with
    `lagrangian` too, each group's exact solve starts from a Lagrangian bound, plan and
    variable fixing (bounded.py), a single-group instance included.

    Every solver run draws on `budget` (the caller's); a standalone solve gives `time_limit_s`
    instead (default DEFAULT_TIME_LIMIT_S), and this call makes its one Budget of it.
    """
    if budget is None:
        budget = Budget(DEFAULT_TIME_LIMIT_S if time_limit_s is None else time_limit_s)
    elif time_limit_s is not None:
        raise TypeError("solve_instance: give `budget` or `time_limit_s`, not both")
    opts = SolveOptions(time_limit_s=budget.remaining(), rel_gap=rel_gap, threads=threads, seed=seed, formulation=formulation)
    if decompose and backend in EXACT and (separable(instance) or (lagrangian and warm_start and applies(instance))):
        first = solve_by_group(instance, backend, opts, budget, warm_start, lagrangian)
    else:
        first = solve_problem(compiled(instance, budget), backend, opts, warm_start=warm_start, budget=budget)
    if not tie_break or backend not in EXACT:
        return first
    return second_objective(instance, first, backend, opts, budget)
