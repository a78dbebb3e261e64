"""solve_instance: TrainingInstance -> checked plan, or an infeasibility diagnosis.

compile -> (greedy warm start) -> backend -> decode -> instance.evaluate. The reported
objective is always evaluate's, computed from the instance alone; a backend plan that
evaluate finds in breach of a bound is an error, never a result.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from qsync_opt.errors import InfeasibleError, SolverError
from qsync_opt.solver.backends import EXACT, available, get_backend
from qsync_opt.solver.backends.base import RawResult, SolveOptions, Status, constant_infeasibility
from qsync_opt.solver.greedy import greedy
from qsync_opt.solver.instance import Assignment, Evaluation, TrainingInstance, evaluate
from qsync_opt.solver.problem import Problem
from qsync_opt.solver.training import compile_training

DEFAULT_BACKEND = "highs"
"""Measured with tests/solver/measure_backends.py (synthetic, 5 precisions x 4 groups, gap 0.1%,
60 s limit, 2 cores): HiGHS was fastest on 6 of 8 sizes and the only backend to reach the gap
on every instance up to 1,000 ops (DAG-1000: 50 s; CBC 60 s, SCIP/CP-SAT at 6% gap); at
5,000 ops no backend closed the gap in 60 s and HiGHS held the best plan on the chain."""


@dataclass(frozen=True)
class SolveResult:
    assignment: Assignment
    status: Status
    objective: float
    """instance.evaluate's objective of the plan (Problem objective for a bare Problem)."""
    bound: float | None
    gap: float | None
    wall_s: float
    backend: str
    warm_start_used: bool
    scaling: dict | None = None
    """CP-SAT: scale bits, objective error bound, largest relative row error."""
    evaluation: Evaluation | None = None
    message: str = ""
    problem_stats: dict = field(default_factory=dict)


def solve_instance(
    instance: TrainingInstance,
    backend: str = DEFAULT_BACKEND,
    time_limit_s: float = 60.0,
    rel_gap: float = 1e-4,
    threads: int | None = None,
    seed: int = 0,
    warm_start: bool = True,
    formulation: str = "mccormick",
) -> SolveResult:
    """The best plan `backend` finds within the limits; InfeasibleError (with diagnosis) if none exists."""
    problem = compile_training(instance)
    opts = SolveOptions(time_limit_s=time_limit_s, rel_gap=rel_gap, threads=threads, seed=seed, formulation=formulation)
    return solve_problem(problem, backend, opts, warm_start=warm_start)


def solve_problem(problem: Problem, backend: str = DEFAULT_BACKEND, options: SolveOptions | None = None, warm_start: bool = True) -> SolveResult:
    """Solve a compiled (or JSON-imported) Problem; evaluation needs `problem.source`."""
    options = options or SolveOptions()
    be = get_backend(backend)
    if not be.available():
        ok = [n for n, a in available().items() if a]
        raise SolverError(f"backend {backend!r} is not available here; available: {', '.join(ok)}")
    instance: TrainingInstance | None = problem.source
    if not problem.variables:  # every op pinned (e.g. all groups train at fp32): nothing to search
        return _finish(problem, _nothing_to_choose(problem, backend))
    if warm_start and backend != "greedy" and instance is not None:
        g = greedy(instance)
        if g.feasible:
            hint = problem.encode(g.assignment)
            if not problem.violated(hint):
                options = replace(options, hint=hint)
    raw = be.solve(problem, options)
    return _finish(problem, _no_worse_than_the_start(problem, raw, options.hint))


def _no_worse_than_the_start(problem: Problem, raw: RawResult, hint: dict[str, float] | None) -> RawResult:
    """A run stopped at its limit with no plan, or a worse one, gives back the checked warm start.

    (CP-SAT can miss the start: its rounded-up rows may cut off a plan that fills a bound.)
    """
    if hint is None or raw.status not in ("unknown", "feasible"):
        return raw
    start = problem.objective_value(hint)
    if raw.status == "feasible" and raw.objective <= start:
        return raw
    return RawResult(
        raw.backend, "feasible", values=hint, objective=start, bound=raw.bound, wall_s=raw.wall_s,
        warm_start_used=True, scaling=raw.scaling,
        message=f"{raw.message}; nothing better than the greedy warm start within the limit",
    )


def _nothing_to_choose(problem: Problem, backend: str) -> RawResult:
    """The only plan of a problem without variables: optimal if its constant rows hold."""
    from qsync_opt.solver.backends.linear import linearize

    model = linearize(problem, "mccormick")
    if (early := constant_infeasibility(model, backend)) is not None:
        return early
    value = problem.objective_constant * problem.objective_unit
    return RawResult(backend, "optimal", values={}, objective=value, bound=value, gap=0.0,
                     message="no free choice: every operator has a single allowed precision")


def _finish(problem: Problem, raw: RawResult) -> SolveResult:
    instance = problem.source
    if raw.status == "infeasible":
        diag = diagnose(instance) if instance is not None else []
        if not diag and raw.message:
            diag = [raw.message]
        raise InfeasibleError(f"no plan satisfies the bounds ({raw.backend} proved it)", diag)
    if raw.status in ("unknown", "error") or raw.values is None:
        if raw.status == "unknown" and instance is not None:
            diag = diagnose(instance)
            if diag:
                raise InfeasibleError(f"no plan satisfies the bounds ({raw.backend} found none)", diag)
        fix = "use an exact backend such as 'highs'" if raw.backend == "greedy" else "raise time_limit_s, or try another backend"
        raise SolverError(f"backend {raw.backend}: no plan ({raw.status}: {raw.message or 'no message'}); fix: {fix}")
    assignment = problem.decode(raw.values)
    ev, objective = None, raw.objective
    if instance is not None:
        ev = evaluate(instance, assignment)
        if ev.violations:
            raise SolverError(f"backend {raw.backend} returned a plan that breaks the instance: {'; '.join(ev.violations)}")
        objective = ev.objective(instance)
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
    )


# ---- diagnosis ------------------------------------------------------------------------------
def diagnose(instance: TrainingInstance, time_limit_s: float = 60.0) -> list[str]:
    """Why `instance` has no plan: per group, which bound, the best achievable value, the shortfall.

    Memory is separable (its least value takes each op's lowest-memory precision); the least
    time, with casts, comes from an exact auxiliary solve of that group alone. Only proven
    shortfalls are listed (an auxiliary solve stopped early contributes its bound, never its
    plan); an empty list means none was found.
    """
    lines: list[str] = []
    for g in instance.groups:
        low = {op: min(ps, key=lambda p: g.mem_bytes[op][p]) for op, ps in g.allowed.items()}
        min_mem = g.fixed_mem_bytes + sum(g.mem_bytes[op][p] for op, p in low.items())
        if min_mem > g.mem_capacity_bytes * (1 + 1e-9):
            at = f"at {next(iter(set(low.values())))} everywhere" if len(set(low.values())) == 1 else "at each op's lowest-memory precision"
            lines.append(
                f"{g.name}: memory needs ≥ {_gib(min_mem)} {at}, capacity {_gib(g.mem_capacity_bytes)} "
                f"(short by {_gib(min_mem - g.mem_capacity_bytes)})"
            )
            continue
        if g.time_bound_ms is None:
            continue
        alone = replace(g, time_bound_ms=None, mem_capacity_bytes=math.inf)
        t_free = _least_time(instance, alone, time_limit_s)
        if t_free is not None and t_free > g.time_bound_ms * (1 + 1e-9):
            lines.append(
                f"{g.name}: time needs ≥ {t_free:.4g} ms even at the fastest plan (casts included), "
                f"bound {g.time_bound_ms:.4g} ms (over by {t_free - g.time_bound_ms:.4g} ms)"
            )
            continue
        if math.isfinite(g.mem_capacity_bytes):
            t_mem = _least_time(instance, replace(g, time_bound_ms=None), time_limit_s)
            if t_mem is not None and t_mem > g.time_bound_ms * (1 + 1e-9):
                lines.append(
                    f"{g.name}: time and memory cannot both hold: within memory capacity "
                    f"{_gib(g.mem_capacity_bytes)} the least time is {t_mem:.4g} ms, bound {g.time_bound_ms:.4g} ms"
                )
    if not lines and instance.max_degradation is not None:
        relaxed = replace(instance, objective="accuracy_degradation", max_degradation=None)
        least = _proven_least(_exact(compile_training(relaxed), time_limit_s))
        if least is not None and least > instance.max_degradation * (1 + 1e-9):
            lines.append(
                f"indicator budget: the least share-weighted indicator within the time and memory bounds is "
                f"{least:.6g}, budget {instance.max_degradation:.6g} (over by {least - instance.max_degradation:.3g})"
            )
    return lines


def _least_time(instance: TrainingInstance, g, time_limit_s: float) -> float | None:
    sub = TrainingInstance(groups=(g,), omega=instance.omega, objective="iteration_time")
    return _proven_least(_exact(compile_training(sub), time_limit_s))


def _proven_least(raw: RawResult) -> float | None:
    """A value no plan beats: the optimum, or the solver's bound if it stopped early; None if unknown."""
    if raw.status == "optimal":
        return raw.objective
    return raw.bound if raw.status == "feasible" else None


def _exact(problem: Problem, time_limit_s: float) -> RawResult:
    ok = available()
    name = DEFAULT_BACKEND if ok.get(DEFAULT_BACKEND) and DEFAULT_BACKEND in EXACT else next(n for n in EXACT if ok[n])
    return get_backend(name).solve(problem, SolveOptions(time_limit_s=time_limit_s, rel_gap=0.0))


def _gib(b: float) -> str:
    return "∞" if math.isinf(b) else f"{b / 2**30:.3g} GiB"
