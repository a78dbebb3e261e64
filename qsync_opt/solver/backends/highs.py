"""HiGHS through PuLP's `pulp.HiGHS` (the highspy bindings), read back from highspy itself.

PuLP's HiGHS class reports "Optimal" at a time limit and has no warm start, so a small
subclass sets the greedy plan with `Highs.setSolution` before `run()`, and the status,
bound and gap come from `Highs.getModelStatus()` / `getInfo()`.

Never mix with OR-Tools' own HiGHS (pywraplp "HIGHS"): two HiGHS builds in one process
segfault. Nothing in this package routes a model there.
"""

from __future__ import annotations

import time

from qsync_opt.solver.backends.base import RawResult, SolveOptions, constant_infeasibility, result_from_values
from qsync_opt.solver.backends.linear import linearize
from qsync_opt.solver.backends.pulp_model import build_pulp, pulp_values
from qsync_opt.solver.backends.quiet import swallow_highs_banner
from qsync_opt.solver.problem import Problem

name = "highs"
PRESOLVE_OFF_ABOVE_COLUMNS = 250_000
"""HiGHS 1.16's presolve probing ignores the time limit on very large models (5,000 ops x 5
precisions x 4 groups, 460k columns: 107 s in probing under a 20 s limit); above this size
presolve is turned off, which keeps the limit (and the solve is no slower there)."""


def available() -> bool:
    try:
        import highspy  # noqa: F401
        import pulp

        return bool(pulp.HiGHS(msg=False).available())
    except Exception:
        return False


def solve(problem: Problem, options: SolveOptions) -> RawResult:
    t0 = time.perf_counter()
    model = linearize(problem, options.formulation)
    if (early := constant_infeasibility(model, name, t0)) is not None:
        return early
    hint = model.hint(options.hint) if options.hint else None
    res = _run(problem, model, options, hint, t0)
    if hint is not None and res.status in ("optimal", "feasible") and res.extra.get("highs_objective") is not None:
        said = (res.extra["highs_objective"] + problem.objective_constant) * problem.objective_unit
        if abs(said - res.objective) > 1e-6 * max(1.0, abs(said)):
            # HiGHS 1.16 can map a MIP start into presolve's reduced space, declare that point
            # optimal, and hand back the unimproved start: solve again without it.
            res = _run(problem, model, options, None, t0)
            res.message += " (warm start dropped: HiGHS returned its start point as optimal)"
    return res


def _run(problem: Problem, model, options: SolveOptions, hint, t0: float) -> RawResult:
    import highspy
    import pulp

    swallow_highs_banner()
    prob, xs = build_pulp(model, "qsync_highs")

    class _HiGHSWithStart(pulp.HiGHS):
        def callSolver(self, lp):
            if hint is not None:
                sol = highspy.HighsSolution()
                cols = [0.0] * lp.solverModel.getNumCol()
                for v in lp.variables():
                    cols[v.index] = float(hint.get(v.name, 0.0))
                sol.col_value = cols
                lp.solverModel.setSolution(sol)
            # HiGHS keeps one process-wide thread pool; a run asking for another thread count
            # than the pool's fails with "Not Set" unless the pool is reset first.
            highspy.Highs.resetGlobalScheduler(True)
            lp.solverModel.run()

    params = {"random_seed": int(options.seed), "mip_abs_gap": 1e-9}
    if len(model.variables) > PRESOLVE_OFF_ABOVE_COLUMNS:
        params["presolve"] = "off"
    solver = _HiGHSWithStart(
        msg=options.msg,
        timeLimit=options.time_limit_s,
        gapRel=options.rel_gap,
        threads=options.threads,
        **params,
    )
    try:
        prob.solve(solver)
    except Exception as e:  # PuLP wraps highspy failures in varied types
        return RawResult(name, "error", wall_s=time.perf_counter() - t0, message=f"{type(e).__name__}: {e}")
    h = prob.solverModel
    st, info = h.getModelStatus(), h.getInfo()
    has_plan = info.primal_solution_status == 2  # kSolutionStatusFeasible
    S = highspy.HighsModelStatus
    if st == S.kOptimal:
        status = "optimal"
    elif st in (S.kInfeasible, S.kUnboundedOrInfeasible):
        status = "infeasible"
    elif st in (S.kTimeLimit, S.kIterationLimit, S.kInterrupt, S.kSolutionLimit, S.kObjectiveBound, S.kObjectiveTarget):
        status = "feasible" if has_plan else "unknown"
    else:
        status = "error"
    found = status in ("optimal", "feasible")
    bound = (info.mip_dual_bound if _is_mip(model) else info.objective_function_value) if found else None
    res = result_from_values(
        name,
        problem,
        status,
        pulp_values(xs) if found else None,
        bound,
        time.perf_counter() - t0,
        warm_start_used=hint is not None,
        message=h.modelStatusToString(st),
    )
    res.extra["highs_objective"] = info.objective_function_value if found else None
    return res


def _is_mip(model) -> bool:
    return any(v.kind != "continuous" for v in model.variables.values())
