"""SCIP through OR-Tools' pywraplp.

Status, best bound and hint come from pywraplp directly (FEASIBLE means stopped at a limit
with a plan). Only the "SCIP" id is ever created here — never "HIGHS", whose second HiGHS
build crashes a process that has already used highspy.
"""

from __future__ import annotations

import math
import time

from qsync_opt.solver.backends.base import (RawResult, SolveOptions, prologue, result_from_values, seconds_left,
                                            stop_at_deadline)
from qsync_opt.solver.problem import Problem

name = "scip"


def available() -> bool:
    try:
        from ortools.linear_solver import pywraplp

        return pywraplp.Solver.CreateSolver("SCIP") is not None
    except Exception:
        return False


def solve(problem: Problem, options: SolveOptions) -> RawResult:
    from ortools.linear_solver import pywraplp

    pro = prologue(problem, options, name)
    if pro.early is not None:
        return pro.early
    t0, model = pro.t0, pro.model
    s = pywraplp.Solver.CreateSolver("SCIP")
    if s is None:
        return RawResult(name, "error", message="OR-Tools was built without SCIP")
    inf = s.infinity()
    xs = {}
    for v in model.variables.values():
        lb = -inf if math.isinf(v.lb) else v.lb
        ub = inf if math.isinf(v.ub) else v.ub
        xs[v.name] = s.NumVar(lb, ub, v.name) if v.kind == "continuous" else s.IntVar(lb, ub, v.name)
    for oh in model.onehots:
        row = s.Constraint(1.0, 1.0, oh.name)
        for v in oh.variables:
            row.SetCoefficient(xs[v], 1.0)
    for c in model.constraints:
        lo = c.rhs if c.sense in (">=", "==") else -inf
        hi = c.rhs if c.sense in ("<=", "==") else inf
        row = s.Constraint(lo, hi, c.name)
        for v, a in c.coeffs.items():
            row.SetCoefficient(xs[v], a)
    obj = s.Objective()
    for v, a in model.objective.items():
        obj.SetCoefficient(xs[v], a)
    obj.SetMinimization()
    if options.threads:
        s.SetNumThreads(int(options.threads))
    s.SetSolverSpecificParametersAsString(f"randomization/randomseedshift = {int(options.seed)}\n")
    if options.msg:
        s.EnableOutput()
    warm = pro.hint is not None
    if warm:
        hint = pro.hint
        names = list(xs)
        s.SetHint([xs[n] for n in names], [float(hint[n]) for n in names])
    params = pywraplp.MPSolverParameters()
    params.SetDoubleParam(params.RELATIVE_MIP_GAP, float(options.rel_gap))
    build_s = time.perf_counter() - t0
    s.SetTimeLimit(int(max(1, seconds_left(options) * 1000)))  # ms, after the build: see SolveOptions.deadline
    with stop_at_deadline(options, s.InterruptSolve) as stops:
        code = s.Solve(params)
    status = {
        s.OPTIMAL: "optimal",
        s.FEASIBLE: "feasible",
        s.INFEASIBLE: "infeasible",
        s.NOT_SOLVED: "unknown",
    }.get(code, "error")
    message = ""
    if code == s.ABNORMAL and stops.sent:
        # Interrupted at the caller's deadline, SCIP sometimes answers ABNORMAL rather than NOT_SOLVED (more often on
        # a busy machine). It was stopped, not broken: nothing is proven and no solution is read.
        status, message = "unknown", "stopped at the deadline before SCIP reported a solution (SCIP: ABNORMAL)"
    values = {n: x.solution_value() for n, x in xs.items()} if status in ("optimal", "feasible") else None
    bound = obj.BestBound() if status in ("optimal", "feasible") else None
    return result_from_values(name, problem, status, values, bound, time.perf_counter() - t0, warm_start_used=warm,
                              build_s=build_s, message=message)
