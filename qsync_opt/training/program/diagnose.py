"""diagnose: why an instance has no plan, from exact side-solves that share the caller's budget."""

from __future__ import annotations

import math
import time
from dataclasses import replace

from qsync_opt.solver.backends import EXACT, available, get_backend
from qsync_opt.solver.backends.base import RawResult, SolveOptions
from qsync_opt.solver.budget import DEFAULT_TIME_LIMIT_S, Budget
from qsync_opt.training.program.instance import TrainingInstance
from qsync_opt.training.program.compile import compile_training
from qsync_opt.errors import QSyncError

DEFAULT_EXACT = "highs"


class Diagnosis(list):
    """The diagnosis lines (a list of str, as before), with what a caller can compare or act on.

    `worst_time_ratio`: over the groups with a time bound, the largest proven least time (within
    memory) divided by the bound; > 1 means that group cannot keep pace (None: not computed).
    `fixes`: changes to the spec proven to give a plan (checked by an exact solve)."""

    worst_time_ratio: float | None = None
    fixes: list[str]


def diagnose(instance: TrainingInstance, budget: Budget | None = None) -> Diagnosis:
    """Why `instance` has no plan: per group, which bound, the best achievable value, the shortfall.

    Memory is separable (its least value takes each op's lowest-memory precision); the least
    time, with casts, comes from an exact auxiliary solve of that group alone. Only proven
    shortfalls are listed (an auxiliary solve stopped early contributes its bound, never its
    plan); an empty list means none was found. The side-solves draw on `budget` (the caller's;
    a standalone diagnosis gets one of DEFAULT_TIME_LIMIT_S); when it runs out, the last line says the diagnosis is
    incomplete, and the status stays unknown.

    After the shortfalls come the fixes it can prove, as "fix: ..." lines: the least
    `objective.max_iteration_time` at which an exact solve finds a plan (when time is short),
    and the least indicator budget (when that is what is short).
    """
    if budget is None:
        budget = Budget(DEFAULT_TIME_LIMIT_S)
    lines = Diagnosis()
    lines.fixes = []
    least_ms: dict[str, float] = {}  # proven least time within memory, per bounded group
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
        t_free = _least_time(instance, alone, budget)
        t_mem = t_free
        if math.isfinite(g.mem_capacity_bytes) and t_free is not None:
            t_mem = _least_time(instance, replace(g, time_bound_ms=None), budget)
        if t_mem is not None:
            least_ms[g.name] = t_mem
        if t_free is not None and t_free > g.time_bound_ms * (1 + 1e-9):
            lines.append(
                f"{g.name}: time needs ≥ {t_free:.4g} ms even at the fastest plan (casts included), "
                f"bound {g.time_bound_ms:.4g} ms (over by {t_free - g.time_bound_ms:.4g} ms)"
            )
        elif t_mem is not None and t_mem > g.time_bound_ms * (1 + 1e-9):
            lines.append(
                f"{g.name}: time and memory cannot both hold: within memory capacity "
                f"{_gib(g.mem_capacity_bytes)} the least time is {t_mem:.4g} ms, bound {g.time_bound_ms:.4g} ms"
            )
    if not lines and instance.max_degradation is not None:
        relaxed = replace(instance, objective="accuracy_degradation", max_degradation=None)
        least = _proven_least(_exact(relaxed, budget))
        if least is not None and least > instance.max_degradation * (1 + 1e-9):
            lines.append(
                f"indicator budget: the least share-weighted indicator within the time and memory bounds is "
                f"{least:.6g}, budget {instance.max_degradation:.6g} (over by {least - instance.max_degradation:.3g})"
            )
            fix = (f"fix: objective.max_accuracy_degradation: {_up(least):.6g} (an absolute indicator budget) is the "
                   "least with a plan (proven optimum of the indicator within the bounds)")
            lines.fixes.append(fix)
            lines.append(fix)
    bounded = {g.name: g.time_bound_ms for g in instance.groups if g.time_bound_ms is not None}
    if least_ms:
        lines.worst_time_ratio = max(least_ms[n] / bounded[n] for n in least_ms)
    if lines and lines.worst_time_ratio is not None and lines.worst_time_ratio > 1 + 1e-9:
        _propose_bound(instance, least_ms, bounded, budget, lines)
    if budget.exhausted:
        lines.append("diagnosis incomplete: the time limit was spent before every bound was checked")
    return lines


def _propose_bound(instance: TrainingInstance, least_ms: dict[str, float], bounded: dict[str, float],
                   budget: Budget, lines: Diagnosis) -> None:
    """The least numeric max_iteration_time with a plan: every bounded group's least time, rounded up
    to the microsecond, and checked by an exact solve of the instance with that bound on every group."""
    if set(least_ms) != set(bounded):  # a group's least time is unknown: nothing to prove
        return
    bound = math.ceil(max(least_ms.values()) * 1000 - 1e-6) / 1000  # the exact solve below checks it
    # a numeric max_iteration_time bounds every group, the pace-setters too
    trial = replace(instance, groups=tuple(replace(g, time_bound_ms=bound) for g in instance.groups))
    if not _has_plan(trial, budget):
        return
    fix = (f"fix: objective.max_iteration_time: {bound:g} (ms, on every group) has a plan (checked by an exact "
           f"solve); it is the least time the slowest group can reach")
    if instance.max_degradation is not None:
        fix += ", within the indicator budget"
    lines.fixes.append(fix)
    lines.append(fix)


_solve_problem = None
"""The signed exact solve the proposed fixes are checked with: backend_solve.solve_problem, which
registers itself on import (use_solver), since it calls diagnose in turn and the modules import no cycle."""


def use_solver(solve_problem) -> None:
    global _solve_problem
    _solve_problem = solve_problem


def _has_plan(instance: TrainingInstance, budget: Budget) -> bool:
    """Whether an exact solve finds a plan (through solve_problem, which also settles programs
    that presolve empties, e.g. every group but one fixed to its only format)."""

    solve_problem = _solve_problem
    if solve_problem is None:  # no solver registered (backend_solve not imported): no fix is claimed
        return False

    if budget.exhausted:
        return False
    name = DEFAULT_EXACT if get_backend(DEFAULT_EXACT).available() else next(n for n, ok in available().items() if ok and n in EXACT)
    t0 = time.perf_counter()
    problem = compile_training(instance)
    budget.charge(time.perf_counter() - t0, build_s=time.perf_counter() - t0)
    try:
        r = solve_problem(problem, name, SolveOptions(rel_gap=0.0), budget=budget)
    except QSyncError:  # infeasible (its own diagnosis finds nothing to propose: every group meets the bound alone)
        return False
    return r.status in ("optimal", "feasible")


def _least_time(instance: TrainingInstance, g, budget: Budget) -> float | None:
    sub = TrainingInstance(groups=(g,), omega=instance.omega, objective="iteration_time")
    return _proven_least(_exact(sub, budget))


def _proven_least(raw: RawResult) -> float | None:
    """A value no plan beats: the optimum, or the solver's bound if it stopped early; None if unknown."""
    if raw.status == "optimal":
        return raw.objective
    return raw.bound if raw.status == "feasible" else None


def _exact(instance: TrainingInstance, budget: Budget) -> RawResult:
    """An exact side-solve on what remains of `budget`; compiling it counts as build time."""
    if budget.exhausted:
        return RawResult(DEFAULT_EXACT, "unknown", message="time limit spent")
    name = DEFAULT_EXACT if get_backend(DEFAULT_EXACT).available() else next(n for n, ok in available().items() if ok and n in EXACT)
    if budget.exhausted:
        return RawResult(name, "unknown", message="time limit spent")
    t0 = time.perf_counter()
    problem = compile_training(instance)
    budget.charge(time.perf_counter() - t0, build_s=time.perf_counter() - t0)
    given = budget.grant(f"diagnosis {problem.name}")
    if given is None:
        return RawResult(name, "unknown", message="time limit spent")
    raw = get_backend(name).solve(problem, SolveOptions(time_limit_s=given, rel_gap=0.0))
    budget.charge(raw.wall_s, raw.build_s)
    if not raw.bound_in_plan_units:
        raw = replace(raw, bound=None)
    return raw


def _up(x: float) -> float:
    """`x` rounded up in its 6th significant digit (so the printed budget is not below the least)."""
    if x <= 0:
        return x
    scale = 10 ** (math.floor(math.log10(x)) - 5)
    return math.ceil(x / scale * (1 - 1e-12)) * scale


def _gib(b: float) -> str:
    return "∞" if math.isinf(b) else f"{b / 2**30:.3g} GiB"
