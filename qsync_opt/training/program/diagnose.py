"""diagnose: why an instance has no plan, from exact side-solves that share the caller's budget."""

from __future__ import annotations

import math
import time
from dataclasses import replace

from qsync_opt.solver.backends import EXACT, available, get_backend
from qsync_opt.solver.backends.base import RawResult, SolveOptions
from qsync_opt.solver.budget import Budget
from qsync_opt.training.program.instance import TrainingInstance
from qsync_opt.training.program.compile import compile_training

DEFAULT_EXACT = "highs"

def diagnose(instance: TrainingInstance, time_limit_s: float = 60.0, budget: Budget | None = None) -> list[str]:
    """Why `instance` has no plan: per group, which bound, the best achievable value, the shortfall.

    Memory is separable (its least value takes each op's lowest-memory precision); the least
    time, with casts, comes from an exact auxiliary solve of that group alone. Only proven
    shortfalls are listed (an auxiliary solve stopped early contributes its bound, never its
    plan); an empty list means none was found. The side-solves draw on `budget` (a fresh one of
    `time_limit_s` if none is given); when it runs out, the last line says the diagnosis is
    incomplete, and the status stays unknown.
    """
    budget = budget or Budget(time_limit_s)
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
        t_free = _least_time(instance, alone, budget)
        if t_free is not None and t_free > g.time_bound_ms * (1 + 1e-9):
            lines.append(
                f"{g.name}: time needs ≥ {t_free:.4g} ms even at the fastest plan (casts included), "
                f"bound {g.time_bound_ms:.4g} ms (over by {t_free - g.time_bound_ms:.4g} ms)"
            )
            continue
        if math.isfinite(g.mem_capacity_bytes):
            t_mem = _least_time(instance, replace(g, time_bound_ms=None), budget)
            if t_mem is not None and t_mem > g.time_bound_ms * (1 + 1e-9):
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
    if budget.exhausted:
        lines.append("diagnosis incomplete: the time limit was spent before every bound was checked")
    return lines


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


def _gib(b: float) -> str:
    return "∞" if math.isinf(b) else f"{b / 2**30:.3g} GiB"
