"""One exact or heuristic solve of a training Problem, signed: the layer below solve_instance.

compile -> (greedy warm start) -> backend -> sign -> decode -> instance.evaluate. The
reported objective is always evaluate's, computed from the instance alone; a backend plan
that evaluate finds in breach of a bound is an error, never a result. `sign` decides the
status from facts in plan units only.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace

from qsync_opt.errors import InfeasibleError, SolverError
from qsync_opt.solver.backends import EXACT, available, get_backend
from qsync_opt.solver.backends.base import RawResult, SolveOptions, Status, constant_infeasibility, proven_within
from qsync_opt.solver.budget import Budget
from qsync_opt.solver.problem import Problem
from qsync_opt.training.program.compile import compile_training
from qsync_opt.training.program.diagnose import diagnose, use_solver
from qsync_opt.training.program.greedy import greedy
from qsync_opt.training.program.instance import Assignment, Evaluation, TrainingInstance, evaluate
from qsync_opt.solver.backends.linear import linearize

DEFAULT_BACKEND = "highs"
"""Measured with `qsync-opt bench solvers` (synthetic, 5 precisions x 4 groups): HiGHS was the
fastest exact backend on most sizes; see benchmarks/results/ for the table and its command."""

WARM_START_SHARE = 0.3
"""At most this part of what remains goes to the greedy warm start (past it: the fastest plan)."""
GREEDY_ALWAYS_CHOICES = 2000
"""Up to this many choices greedy always runs to the end (milliseconds), so no solve returns a
plan worse than QSync's; above, it is cut at its share (seconds per group at 5,000 ops)."""
CHECK_S_PER_VARIABLE = 3e-6
"""Encoding and checking a warm start, seconds per variable (above the measured cost: docs/program.md)."""
POST_S_PER_VARIABLE = 2e-5
"""Kept back from the solver's grant, seconds per variable, for what its time limit does not stop: a
solver's overrun of its own limit on a large model, and signing, decoding and evaluating the plan
(docs/program.md has the measurements)."""


@dataclass(frozen=True)
class SolveResult:
    assignment: Assignment
    status: Status
    objective: float
    """instance.evaluate's objective of the plan (Problem objective for a bare Problem)."""
    bound: float | None
    """A value no plan beats, in plan units (None when none is proven)."""
    gap: float | None
    wall_s: float
    backend: str
    warm_start_used: bool
    scaling: dict | None = None
    """CP-SAT: scale bits, objective error bound, largest relative row error."""
    evaluation: Evaluation | None = None
    message: str = ""
    problem_stats: dict = field(default_factory=dict)
    build_s: float = 0.0
    """Seconds spent building models (compile, linearise, hand to the solver)."""
    solve_s: float = 0.0
    """Seconds spent in solvers and heuristics: what time_limit_s bounds."""


def compiled(instance: TrainingInstance, budget: Budget) -> Problem:
    t0 = time.perf_counter()
    problem = compile_training(instance)
    budget.charge(time.perf_counter() - t0, build_s=time.perf_counter() - t0)
    return problem


def solve_problem(
    problem: Problem,
    backend: str = DEFAULT_BACKEND,
    options: SolveOptions | None = None,
    warm_start: bool = True,
    budget: Budget | None = None,
    start: Assignment | None = None,
) -> SolveResult:
    """Solve a compiled (or JSON-imported) Problem; evaluation needs `problem.source`.

    `start` (an Assignment) replaces the greedy warm start; it is used only if it checks.
    Every solver run draws on `budget` (the caller's); a standalone solve (a problem read from a
    file) gives none, and `options.time_limit_s` is then its one Budget.
    """

    options = options or SolveOptions()
    if budget is None:
        budget = Budget(options.time_limit_s)
    be = get_backend(backend)
    if not be.available():
        ok = [n for n, a in available().items() if a]
        raise SolverError(f"backend {backend!r} is not available here; available: {', '.join(ok)}")
    instance: TrainingInstance | None = problem.source
    built0, spent0 = budget.build_s, budget.spent_s
    if not problem.variables:  # every op pinned (e.g. all groups train at fp32): nothing to search
        return _finish(problem, _nothing_to_choose(problem, backend), budget, built0, spent0)
    hint = None
    if warm_start and backend != "greedy" and (instance is not None or start is not None):
        t0 = time.perf_counter()
        share = budget.remaining() * WARM_START_SHARE - CHECK_S_PER_VARIABLE * len(problem.variables)
        if start is None:  # QSync's allocator; on large programs cut at its share of the limit
            cheap = len(problem.choices) <= GREEDY_ALWAYS_CHOICES
            g = greedy(instance, deadline=None if cheap else t0 + share)
            start = g.assignment if g.feasible else None
        if start is not None:
            cand = problem.encode(start)
            hint = cand if not problem.violated(cand) else None
        budget.charge(time.perf_counter() - t0)
    given = budget.grant(f"{backend} solve", budget.remaining() - POST_S_PER_VARIABLE * len(problem.variables))
    if given is None:
        raw = RawResult(backend, "unknown", message="time limit spent before the solver could start")
    else:
        raw = be.solve(problem, replace(options, time_limit_s=given, hint=hint))
        budget.charge(raw.wall_s, raw.build_s)
    t0 = time.perf_counter()
    signed = sign(problem, raw, replace(options, hint=hint))
    budget.charge(time.perf_counter() - t0)
    return _finish(problem, signed, budget, built0, spent0)


def sign(problem: Problem, raw: RawResult, options: SolveOptions) -> RawResult:
    """The status we can sign: the better of the solver's plan and the checked warm start,
    "optimal" only when its true gap to a bound valid for the real program is within rel_gap.

    A solver's "infeasible" against a checked start is a contradiction: the start wins, and
    the message says so. A run with no plan and no proof is "unknown", never "infeasible".
    """
    if raw.status == "error" and options.hint is None:
        return raw
    bound = raw.bound if raw.bound_in_plan_units else None
    trivial = problem.trivial_bound() if raw.backend in EXACT else -math.inf  # valid whatever the solver did;
    if math.isfinite(trivial) and (bound is None or trivial > bound):  # it decides when the optimum is 0
        bound = trivial
    candidates = []
    if raw.values is not None and raw.objective is not None:
        candidates.append((raw.objective, raw.values, False))
    if options.hint is not None:
        candidates.append((problem.objective_value(options.hint), options.hint, True))
    if not candidates:
        status = raw.status if raw.status in ("infeasible", "unknown", "error") else "unknown"
        return replace(raw, status=status, bound=bound, gap=None)
    objective, values, from_start = min(candidates, key=lambda c: c[0])  # ties keep the solver's plan
    message = raw.message
    if raw.status == "infeasible":
        message += "; the solver said infeasible, but the checked warm start is a plan"
        bound = None
    elif from_start:
        message += "; nothing better than the greedy warm start within the limit"
    ok, gap = proven_within(objective, bound, options.rel_gap)
    status = "optimal" if ok else "feasible"
    return replace(raw, status=status, values=values, objective=objective, bound=bound, gap=gap,
                   warm_start_used=raw.warm_start_used or from_start, message=message.strip("; "))


def _nothing_to_choose(problem: Problem, backend: str) -> RawResult:
    """The only plan of a problem without variables: optimal if its constant rows hold."""

    model = linearize(problem, "mccormick")
    if (early := constant_infeasibility(model, backend)) is not None:
        return early
    value = problem.objective_constant * problem.objective_unit
    return RawResult(backend, "optimal", values={}, objective=value, bound=value, gap=0.0,
                     message="no free choice: every operator has a single allowed precision")


def _finish(problem: Problem, raw: RawResult, budget: Budget, built0: float, spent0: float) -> SolveResult:
    instance = problem.source
    if raw.status == "infeasible":
        diag = diagnose(instance, budget=budget) if instance is not None else []
        if not diag and raw.message:
            diag = [raw.message]
        raise InfeasibleError(f"no plan satisfies the bounds ({raw.backend} proved it)", diag)
    if raw.status in ("unknown", "error") or raw.values is None:
        if raw.status in ("unknown", "error") and instance is not None:  # an error: e.g. bounds too large for
            diag = diagnose(instance, budget=budget)                      # the backend, on a spec no plan fits
            if diag and not diag[-1].startswith("diagnosis incomplete"):
                raise InfeasibleError(f"no plan satisfies the bounds ({raw.backend} found none)", diag)
        fix = "use an exact backend such as 'highs'" if raw.backend == "greedy" else "raise time_limit_s, or try another backend"
        raise SolverError(f"backend {raw.backend}: no plan ({raw.status}: {raw.message or 'no message'}); fix: {fix}")
    t0 = time.perf_counter()
    assignment = problem.decode(raw.values)
    ev, objective = None, raw.objective
    if instance is not None:
        ev = evaluate(instance, assignment)
        if ev.violations:
            raise SolverError(f"backend {raw.backend} returned a plan that breaks the instance: {'; '.join(ev.violations)}")
        objective = ev.objective(instance)
    budget.charge(time.perf_counter() - t0)  # decoding and checking are part of the answer's time
    return SolveResult(
        assignment=assignment,
        status=raw.status,
        objective=objective,
        bound=raw.bound,
        gap=raw.gap,
        wall_s=raw.wall_s,
        backend=raw.backend,
        warm_start_used=raw.warm_start_used,
        scaling=raw.scaling,
        evaluation=ev,
        message=raw.message,
        problem_stats=problem.stats(),
        build_s=budget.build_s - built0,
        solve_s=budget.spent_s - spent0,
    )


use_solver(solve_problem)  # diagnose checks the fixes it proposes with this very solve
