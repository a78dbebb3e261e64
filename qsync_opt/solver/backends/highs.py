"""HiGHS through highspy directly: the model goes in as sparse arrays, with no PuLP in between.

PuLP builds one Python object per coefficient (slow on large programs: docs/program.md);
`highs_model.build_lp` writes the same LinearModel as row-wise arrays with numpy, and
`Highs.passModel` takes them at once. Status, bound and gap come from
`Highs.getModelStatus()` / `getInfo()`; the greedy plan goes in with `Highs.setSolution`.

Never mix with OR-Tools' own HiGHS (pywraplp "HIGHS"): two HiGHS builds in one process
segfault. Nothing in this package routes a model there.
"""

from __future__ import annotations

import time
from dataclasses import replace

from qsync_opt.solver.backends.base import RawResult, SolveOptions, prologue, result_from_values, seconds_left
from qsync_opt.solver.backends.highs_model import build_lp, is_mip
from qsync_opt.solver.backends.quiet import swallow_highs_banner
from qsync_opt.solver.problem import Problem

name = "highs"
PRESOLVE_OFF_ABOVE_COLUMNS = 50_000
"""HiGHS 1.16's presolve probing ignores the time limit on large models: 107 s under a 20 s limit
at 460k columns, and, per group (110k-195k columns) at 5,000 ops, 388 s (chain) and 156 s (DAG)
under a 60 s budget (benchmarks/results/solvers_scale.csv). Above this size presolve is off."""


def available() -> bool:
    try:
        import highspy  # noqa: F401

        return True
    except Exception:
        return False


def solve(problem: Problem, options: SolveOptions) -> RawResult:
    pro = prologue(problem, options, name)
    if pro.early is not None:
        return pro.early
    lp, names = build_lp(pro.model)
    build_s = time.perf_counter() - pro.t0
    res = _run(problem, lp, names, options, pro.hint, pro.t0, build_s)
    if pro.hint is not None and res.status in ("optimal", "feasible") and res.extra.get("highs_objective") is not None:
        said = (res.extra["highs_objective"] + problem.objective_constant) * problem.objective_unit
        if abs(said - res.objective) > 1e-6 * max(1.0, abs(said)):
            # HiGHS 1.16 can map a MIP start into presolve's reduced space, declare that point
            # optimal, and hand back the unimproved start: solve again without it.
            left = max(0.0, options.time_limit_s - (time.perf_counter() - pro.t0 - build_s))
            res = _run(problem, lp, names, replace(options, time_limit_s=left), None, pro.t0, build_s)
            res.message += " (warm start dropped: HiGHS returned its start point as optimal)"
    return res


def _run(problem: Problem, lp, names: list[str], options: SolveOptions, hint, t0: float, build_s: float) -> RawResult:
    import highspy

    swallow_highs_banner()
    h = highspy.Highs()
    h.setOptionValue("output_flag", bool(options.msg))
    h.setOptionValue("mip_rel_gap", float(options.rel_gap))
    h.setOptionValue("mip_abs_gap", 1e-9)
    h.setOptionValue("random_seed", int(options.seed))
    if options.threads:
        h.setOptionValue("threads", int(options.threads))
    if lp.num_col_ > PRESOLVE_OFF_ABOVE_COLUMNS:
        h.setOptionValue("presolve", "off")
    h.passModel(lp)
    if hint is not None:
        sol = highspy.HighsSolution()
        sol.col_value = [float(hint.get(n, 0.0)) for n in names]
        h.setSolution(sol)
    # HiGHS keeps a thread pool per calling thread; a run asking for another thread count than
    # the pool's fails with "Not Set" unless the pool is reset first. Reset this thread's only:
    # resetGlobalScheduler would pull the pool from under a run on another thread (HiGHS PR 3141).
    reset = getattr(highspy.Highs, "resetThreadScheduler", None) or highspy.Highs.resetGlobalScheduler
    reset(True)
    h.setOptionValue("time_limit", float(seconds_left(options)))  # after the model went in: see SolveOptions.deadline
    try:
        h.run()
    except Exception as e:  # highspy raises varied types on internal failures
        return RawResult(name, "error", wall_s=time.perf_counter() - t0, build_s=build_s, message=f"{type(e).__name__}: {e}")
    st, info = h.getModelStatus(), h.getInfo()
    has_plan = info.primal_solution_status == 2  # kSolutionStatusFeasible
    S = highspy.HighsModelStatus
    if st == S.kOptimal:
        status = "optimal"
    elif st == S.kInfeasible or (st == S.kUnboundedOrInfeasible and _bounded_below(lp)):
        status = "infeasible"  # presolve's "unbounded or infeasible" on a program that cannot be unbounded
    elif st in (S.kTimeLimit, S.kIterationLimit, S.kInterrupt, S.kSolutionLimit, S.kObjectiveBound, S.kObjectiveTarget):
        status = "feasible" if has_plan else "unknown"
    else:
        status = "unknown" if st == S.kUnboundedOrInfeasible else "error"
    found = status in ("optimal", "feasible")
    values = None
    if found:
        col = h.getSolution().col_value
        values = dict(zip(names, col))
    bound = (info.mip_dual_bound if is_mip(lp) else info.objective_function_value) if found else None
    res = result_from_values(
        name, problem, status, values, bound, time.perf_counter() - t0,
        warm_start_used=hint is not None, message=h.modelStatusToString(st), build_s=build_s,
    )
    res.extra["highs_objective"] = info.objective_function_value if found else None
    return res


def _bounded_below(lp) -> bool:
    """Every objective term has a finite bound in its improving direction: no plan can run to -inf."""
    import highspy

    inf = highspy.kHighsInf
    return all((c <= 0 or lo > -inf) and (c >= 0 or hi < inf)
               for c, lo, hi in zip(lp.col_cost_, lp.col_lower_, lp.col_upper_))
