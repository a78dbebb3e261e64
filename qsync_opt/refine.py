"""Solve, let the replayer judge, tighten by what the linear model missed, and keep the best plan seen.

The instance charges each group the all-reduce exposure of its highest-precision plan; a
faster (lower-precision) backward hides less of the all-reduce, which only the replayer's
timeline sees. So a plan the linear model accepts can be over the bound. Each round tightens
the offending group's bound by its measured excess (growing the step when the excess does not
shrink, since a faster plan hides even less), re-solves on the shared time budget, and every
plan seen (the exact ones and greedy's) is judged by the replayer. The answer is the best plan
that meets every bound; if none does, the one closest to them, and the plan says so
(`meets_bounds: false`), never silently.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from qsync_opt.errors import InfeasibleError, SolverError
from qsync_opt.predictor.context import Context
from qsync_opt.predictor.replayer import replay
from qsync_opt.solver.budget import Budget
from qsync_opt.solver.instance import Assignment, TrainingInstance, evaluate

TOL = 1e-6
"""Relative slack on a replayed time against its bound (as evaluate allows on the linear model)."""


@dataclass
class Seen:
    result: dict
    objective: float
    """On the original instance (the user's program)."""
    excess: dict[str, float]
    """group -> replayed time over the original bound, ms (empty: meets every bound)."""
    origin: str


def judge(instance: TrainingInstance, ctx: Context, a: Assignment) -> tuple[float, dict[str, float], dict[str, float]]:
    """(objective, excess per group, linear-model miss per group) of `a` by the replayer."""
    tl = replay(ctx, a)
    ev = evaluate(instance, a)
    excess, miss = {}, {}
    for g in instance.groups:
        t = tl.groups[g.name].iteration_ms
        miss[g.name] = t - ev.time_ms.get(g.name, t)
        if g.time_bound_ms is not None and t > g.time_bound_ms * (1 + TOL):
            excess[g.name] = t - g.time_bound_ms
    return ev.objective(instance), excess, miss


def solve_and_refine(spec, instance: TrainingInstance, ctx: Context, run, budget: Budget, greedy_result: dict | None):
    """(result dict, rounds, meets_bounds). `run(instance)` solves one instance on `budget`."""
    original = instance
    result = run(instance)
    seen: list[Seen] = []

    def record(res: dict, origin: str) -> Seen:
        obj, excess, _ = judge(original, ctx, res["assignment"])
        s = Seen(res, obj, excess, origin)
        seen.append(s)
        return s

    current = record(result, "solve")
    rounds = 0
    notes: list[str] = []
    step = {g.name: 0.0 for g in instance.groups}
    growth = {g.name: 1.0 for g in instance.groups}
    last_excess: dict[str, float] = {}
    while current.excess and rounds < spec.solver.refine_rounds:
        if budget.exhausted:
            notes.append(f"refine stopped after {rounds} rounds: the time limit was spent")
            break
        rounds += 1
        for g, e in current.excess.items():
            if g in last_excess and e > 0.5 * last_excess[g]:
                growth[g] *= 2.0  # the excess did not halve: a faster plan hides even less all-reduce
            step[g] += e * growth[g]
        last_excess = dict(current.excess)
        instance = replace(original, groups=tuple(
            replace(g, time_bound_ms=g.time_bound_ms - step[g.name]) if step[g.name] and g.time_bound_ms is not None else g
            for g in original.groups
        ))
        over = ", ".join(f"{n} over by {v:.3f} ms" for n, v in current.excess.items())
        try:
            nxt = run(instance)
        except (InfeasibleError, SolverError) as e:
            notes.append(f"refine round {rounds}: replayer found {over}; no plan at the tightened bound "
                         f"({str(e).splitlines()[0]})")
            break
        notes.append(f"refine round {rounds}: replayer found {over}; bound tightened by "
                     + ", ".join(f"{n} {v:.3f} ms" for n, v in step.items() if v) + " and re-solved")
        current = record(nxt, f"refine round {rounds}")
    if greedy_result is not None and spec.solver.refine_rounds > 0:
        record(greedy_result, "greedy")
    meeting = [s for s in seen if not s.excess]
    if meeting:
        best = min(meeting, key=lambda s: s.objective)
    else:
        best = min(seen, key=lambda s: (sum(s.excess.values()), s.objective))
        over = ", ".join(f"{n} by {v:.3f} ms" for n, v in best.excess.items())
        notes.append(f"replayer: still over the bound after {rounds} refine rounds (no plan seen meets every bound); "
                     f"the closest is over: {over} "
                     "(raise solver.refine_rounds or time_limit_s, or accept the predicted slowdown)")
    out = dict(best.result)
    if best is not seen[0]:
        notes.append(f"plan from {best.origin} (the best of {len(seen)} plans the replayer judged)")
        first = seen[0].result
        bound = first.get("bound")  # the first program is the loosest: its bound holds for every plan here
        gap = None if bound is None else max(0.0, best.objective - bound) / max(abs(best.objective), 1e-18)
        status = "heuristic" if first["status"] == "heuristic" else "feasible"
        out.update(status=status, bound=bound, gap=gap, objective=best.objective)
    out["notes"] = list(out.get("notes", [])) + notes
    return out, rounds, not best.excess
