"""A problem's own heuristic as a backend: a plan in milliseconds, never a proof.

It runs the heuristic registered for the structured instance the Problem was compiled from
(for a training problem, the TrainingInstance's greedy allocator), so a Problem read from JSON
needs its embedded instance. Status is "feasible" when it finds a
plan and "unknown" when it gives up: a heuristic cannot prove infeasibility.
"""

from __future__ import annotations

import time

from qsync_opt.errors import SolverError
from qsync_opt.solver.export import heuristic_for
from qsync_opt.solver.backends.base import RawResult, SolveOptions, result_from_values
from qsync_opt.solver.problem import Problem

name = "greedy"


def available() -> bool:
    return True


def solve(problem: Problem, options: SolveOptions) -> RawResult:
    heuristic = heuristic_for(problem.source)
    if heuristic is None:
        raise SolverError(
            "backend greedy: the problem carries no TrainingInstance; compile it with "
            "compile_training or export it with its instance (export.problem_to_json(..., with_instance=True))"
        )
    t0 = time.perf_counter()
    res = heuristic()
    if not res.feasible:
        return RawResult(name, "unknown", wall_s=time.perf_counter() - t0, message=f"greedy gave up: {res.reason}")
    values = problem.encode(res.assignment)
    out = result_from_values(name, problem, "feasible", values, None, time.perf_counter() - t0)
    out.extra["steps"] = res.steps
    return out
