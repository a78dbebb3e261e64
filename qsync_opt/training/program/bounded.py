"""One group's exact solve with a Lagrangian first (lagrange.py): bound, incumbent, fixing, then the MIP.

The Lagrangian gives, in well under the MIP's time, a proven bound and a plan; when they
already agree within rel_gap, no MIP is built. Otherwise every precision whose min-marginal
exceeds the incumbent is removed (exact: no plan better than the incumbent uses it), and the
backend solves the much smaller program that is left, from the incumbent.

The bound reported for the group is max(L, min(bound of the reduced MIP, least removed
min-marginal)): the optimum lies in the reduced program or uses a removed precision, and both
sides are bounded. Every figure is in plan units; `sign` decides the status as for any solve.
"""

from __future__ import annotations

import time
from dataclasses import replace

from qsync_opt.solver.backends.base import OPTIMALITY_TOL, SolveOptions, proven_within
from qsync_opt.solver.budget import Budget
from qsync_opt.training.program.greedy import greedy
from qsync_opt.training.program.instance import TrainingInstance, evaluate
from qsync_opt.training.program.lagrange import group_arrays, solve_dual
from qsync_opt.training.program.backend_solve import GREEDY_ALWAYS_CHOICES, SolveResult, compiled, solve_problem

DUAL_SHARE = 0.7
"""At most this part of what remains goes to the Lagrangian; the MIP gets the rest. At 5,000 ops
the dual is what closes the gap (a HiGHS run on the ~25k-column reduced program did not finish
its root LP in 2 s), so it gets most."""
MIN_PASSES = 3
"""The Lagrangian is skipped when fewer DP passes than this would fit in its share."""


def applies(instance: TrainingInstance) -> bool:
    """One group, the indicator objective, no indicator budget, no sync rows: the program the DP bounds.

    The DP prices one time row; with sync rows (the lockstep's bucket terms) its minimisers could
    break a row it does not see, and fixing against such an incumbent would not be exact."""
    return (len(instance.groups) == 1 and instance.objective == "accuracy_degradation"
            and instance.max_degradation is None and not instance.groups[0].sync_rows)


def solve_group(instance: TrainingInstance, backend: str, options: SolveOptions, budget: Budget):
    """A SolveResult for a one-group instance, or None when the Lagrangian does not apply or has no time."""

    if not applies(instance):
        return None
    t0, build0, spent0 = time.perf_counter(), budget.build_s, budget.spent_s
    g = instance.groups[0]
    ga = group_arrays(instance, g)
    built = time.perf_counter() - t0
    budget.charge(built, build_s=built)
    if ga is None:
        return None
    want = budget.remaining() * DUAL_SHARE
    if MIN_PASSES * ga.d.pass_seconds(9) > want or (given := budget.grant("lagrangian", want)) is None:
        return None
    t1 = time.perf_counter()
    start = None
    choices = sum(map(len, ga.allowed))
    if choices <= GREEDY_ALWAYS_CHOICES:  # cheap here: the incumbent is never worse than QSync's
        gr = greedy(instance)
        start = gr.assignment[g.name] if gr.feasible else None
    lag = solve_dual(ga, t1 + given, target_gap=options.rel_gap, start=start)
    budget.charge(time.perf_counter() - t1)
    note = (f"Lagrangian: bound {lag.bound:.6g} in {lag.dp_passes} DP passes ({lag.seconds:.2f} s), "
            f"{choices - lag.kept} of {choices} choices removed")
    if lag.plan is None:
        return None
    plan = {g.name: lag.plan}
    stats = {"binaries": sum(len(ps) for ps in g.allowed.values() if len(ps) > 1),
             "binaries_left": sum(len(ps) for ps in lag.keep.values() if len(ps) > 1)}
    ok, gap = proven_within(lag.objective, lag.bound, max(options.rel_gap, OPTIMALITY_TOL))
    if ok:
        ev = evaluate(instance, plan)
        if not ev.violations:
            return SolveResult(assignment=plan, status="optimal", objective=ev.objective(instance), bound=lag.bound,
                               gap=gap, wall_s=time.perf_counter() - t0, backend=backend, warm_start_used=False,
                               evaluation=ev, message=note + "; proven by the bound alone, no MIP built",
                               problem_stats={**stats, "binaries_left": 0}, build_s=budget.build_s - build0,
                               solve_s=budget.spent_s - spent0)
    reduced = replace(instance, groups=(replace(g, allowed=lag.keep),))
    r = solve_problem(compiled(reduced, budget), backend, options, warm_start=True, budget=budget, start=plan)
    bound = lag.bound if r.bound is None else max(lag.bound, min(r.bound, lag.fixed_floor))  # floor: +inf if none removed
    ok, gap = proven_within(r.objective, bound, max(options.rel_gap, OPTIMALITY_TOL))
    return replace(r, status="optimal" if ok else "feasible", bound=bound, gap=gap,
                   message=f"{note}; reduced program: {r.message or r.status}",
                   problem_stats={**stats, **{f"mip_{k}": v for k, v in r.problem_stats.items()}},
                   build_s=budget.build_s - build0, solve_s=budget.spent_s - spent0, wall_s=time.perf_counter() - t0)
