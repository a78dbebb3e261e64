"""OR-Tools CP-SAT on an integer-scaled copy of the model, with the rounding error reported.

CP-SAT needs integer coefficients. Each row (in ≤ form) is multiplied by a power of two
s_r that puts its largest coefficient just under 2**SCALE_BITS, then coefficients are
rounded *up* and the right-hand side *down*. With non-negative variables this only
tightens the row, so a plan CP-SAT accepts satisfies the real row: plans are always safe.
The tightening is at most err_r = (Σ rounding of the terms that can be 1 together
+ rounding of the rhs) / s_r; `scaling["max_row_error_rel"]` reports the largest err_r
relative to its row's largest coefficient (< (k + 1)·2**(1 − SCALE_BITS) for k active terms).

Continuous variables (the epigraph T) become integers in units of 1/S, where S is the
smallest scale of the rows they appear in (those rows then all use S). The objective is
rounded to nearest; `scaling["objective_error"]` bounds, for any plan, how far its CP-SAT
objective can be from its real one (objective rounding plus the row error carried by T).
CP-SAT's answer is optimal for the tightened model only: its "OPTIMAL" proves nothing
about the real program (it can be percents off the true optimum: docs/program.md). So a second, relaxed
copy (coefficients rounded down, right-hand sides up) is solved with the time left: every
real plan satisfies it, so its bound, less the objective's rounding, bounds the real optimum,
and its plan, if the real rows accept it, competes with the tightened one. This backend
reports "feasible" with that bound; solve.sign() calls a plan optimal only on the true gap.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from qsync_opt.errors import SolverError
from qsync_opt.solver.backends.base import (RawResult, SolveOptions, prologue, proven_within, result_from_values,
                                            seconds_left, stop_at_deadline)
from qsync_opt.solver.backends.linear import LinearModel
from qsync_opt.solver.problem import Problem

name = "cpsat"
SCALE_BITS = 32
OBJECTIVE_BITS = 40
"""Rows and objective keep this many bits: the relaxed copy's bound is then within ~1e-9 of
the real optimum, so CP-SAT can prove small programs optimal in plan units (fewer bits leave
bounds too loose for that: docs/program.md). Sums stay far inside CP-SAT's 64-bit range."""
_BIG = 2**50


def available() -> bool:
    try:
        from ortools.sat.python import cp_model  # noqa: F401

        return True
    except Exception:
        return False


def solve(problem: Problem, options: SolveOptions) -> RawResult:
    """Tightened copy for a plan, then a relaxed copy for a bound that holds for the real program."""
    pro = prologue(problem, options, name)
    if pro.early is not None:
        return pro.early
    lm, t0 = pro.model, pro.t0
    tight = scale_model(lm)
    exact = not any(tight.row_error.values())
    loose = None if exact else scale_model(lm, loose=True)
    build_s = time.perf_counter() - t0
    first = options.time_limit_s if exact else TIGHT_SHARE * options.time_limit_s
    t1 = _run(lm, tight, options, tight.hint(pro.hint) if pro.hint else None, first)
    plans = []  # (real objective, complete values)
    if t1.values is not None:
        done = problem.complete({v: t1.values[v] for v in problem.variables})
        plans.append((problem.objective_value(done), done))
    proof, infeasible, messages = t1 if exact else None, False, [f"tight: {t1.status_name}"]
    if loose is not None:
        left = max(0.0, options.time_limit_s - (time.perf_counter() - t0 - build_s))
        if options.deadline is not None:
            left = min(left, options.deadline - time.perf_counter())
        start = plans[0][1] if plans else (options.hint or None)
        t2 = _run(lm, loose, options, loose.hint(lm.hint(start)) if start else None, left) if left > 1e-3 else None
        if t2 is not None:
            proof, infeasible = t2, t2.code == "infeasible"
            messages.append(f"relaxed: {t2.status_name}")
            if t2.values is not None:
                done = problem.complete({v: t2.values[v] for v in problem.variables})
                if not problem.violated(done):  # the relaxed optimum may be a real plan: then it is the best
                    plans.append((problem.objective_value(done), done))
    bound = None
    if proof is not None and proof.bound is not None:
        sm = tight if exact else loose
        bound = (proof.bound - sm.objective_rounding) / sm.s_obj
    if plans:
        objective, values = min(plans, key=lambda t: t[0])
        real_bound = None if bound is None else (bound + problem.objective_constant) * problem.objective_unit
        status = "optimal" if proven_within(objective, real_bound, options.rel_gap)[0] else "feasible"
    else:
        values = None
        status = "infeasible" if infeasible else "unknown"
    scaling = {
        "scale_bits": SCALE_BITS,
        "objective_error": tight.objective_error * problem.objective_unit,
        "max_row_error_rel": max(tight.row_error_rel.values(), default=0.0),
        "worst_row": tight.worst_row,
        "worst_row_error": tight.row_error.get(tight.worst_row, 0.0),
    }
    return result_from_values(
        name, problem, status, values, bound, time.perf_counter() - t0,
        warm_start_used=pro.hint is not None, scaling=scaling, message="; ".join(messages), build_s=build_s,
    )


PRESOLVE = False
"""OR-Tools 9.15's CP-SAT presolve returns wrong OPTIMALs on these models, with either
linearisation and on the relaxed copy too (random_small(96), arcs: 6.0596 vs the true 5.9269;
random_small(225), products: 0.1668 vs 0.0867); with it off the answers match brute force."""

TIGHT_SHARE = 0.6
"""Share of the time limit for the tightened copy (the plan); the relaxed copy (the bound) gets the rest."""


@dataclass
class _Run:
    code: str
    status_name: str
    values: dict[str, float] | None
    bound: float | None
    """Best bound of the scaled objective."""


def _run(lm: LinearModel, sm: "ScaledModel", options: SolveOptions, hint: dict[str, int] | None, limit: float) -> _Run:
    from ortools.sat.python import cp_model

    m = cp_model.CpModel()
    xs = {}
    for v, var in lm.variables.items():
        if v in sm.cont_scale:
            xs[v] = m.new_int_var(math.ceil(var.lb * sm.S), sm.cont_ub[v], v)
        elif var.kind == "integer":
            xs[v] = m.new_int_var(int(math.ceil(var.lb)), int(min(var.ub, _BIG)), v)
        else:  # binaries and linearised products (integral whenever their factors are)
            xs[v] = m.new_bool_var(v) if var.ub > 0 else m.new_constant(0)
    for oh in lm.onehots:
        m.add_exactly_one(xs[v] for v in oh.variables)

    def weighted(coeffs):
        return cp_model.LinearExpr.weighted_sum([xs[v] for v in coeffs], list(coeffs.values()))

    for coeffs, sense, rhs in sm.rows:
        m.add(weighted(coeffs) <= rhs) if sense == "<=" else m.add(weighted(coeffs) == rhs)
    m.minimize(weighted(sm.objective))
    for v, val in (hint or {}).items():
        m.add_hint(xs[v], val)
    solver = cp_model.CpSolver()
    p = solver.parameters
    p.max_time_in_seconds = float(max(min(limit, seconds_left(options)), 1e-3))  # see SolveOptions.deadline
    if options.deterministic_time_s is not None:
        p.max_deterministic_time = float(options.deterministic_time_s)
    p.relative_gap_limit = float(options.rel_gap)
    p.random_seed = int(options.seed)
    if options.threads:
        p.num_workers = int(options.threads)
    if options.threads != 1:
        # parallel workers race; interleaving makes the search (and so the plan) deterministic
        p.interleave_search = True
    p.log_search_progress = bool(options.msg)
    if not PRESOLVE:
        p.cp_model_presolve = False
    try:
        with stop_at_deadline(options, solver.stop_search):
            code = solver.solve(m)
        status = {cp_model.OPTIMAL: "optimal", cp_model.FEASIBLE: "feasible",
                  cp_model.INFEASIBLE: "infeasible"}.get(code, "unknown")
        found = status in ("optimal", "feasible")
        return _Run(
            status, solver.status_name(code),
            {v: solver.value(x) / sm.cont_scale.get(v, 1.0) for v, x in xs.items()} if found else None,
            solver.best_objective_bound if found else None,
        )
    finally:
        release(m)


def release(m) -> None:
    """Let `m` be freed when its last reference goes, not by the cyclic collector. OR-Tools' CpModel (from 9.12) keeps
    its pre-PEP 8 aliases (AddBoolOr, ...) in its instance dict as closures over its own bound methods: a reference
    cycle, so every model, its whole proto with it, stays alive until the next collection (HiGHS, SCIP and CBC leave
    none; docs/rollout.md). Under `rollout.repack`'s paused collector that collection runs after
    the decision, inside the call. The aliases are never called here."""
    vars(m).clear()


class ScaledModel:
    """Integer rows/objective of a LinearModel plus the error bounds of the rounding."""

    def __init__(self):
        self.rows: list[tuple[dict[str, int], str, int]] = []
        self.row_error: dict[str, float] = {}
        """row -> how much tighter the integer row can be than the real one, in the row's units."""
        self.row_error_rel: dict[str, float] = {}
        """The same divided by the row's largest |coefficient| (unit-free)."""
        self.objective: dict[str, int] = {}
        self.s_obj = 1.0
        self.S = 1.0
        self.cont_scale: dict[str, float] = {}
        self.cont_ub: dict[str, int] = {}
        self.objective_error = 0.0
        self.objective_rounding = 0.0

    @property
    def worst_row(self) -> str | None:
        return max(self.row_error_rel, key=self.row_error_rel.get) if self.row_error_rel else None

    def hint(self, values: dict[str, float]) -> dict[str, int]:
        """Integer hint; each scaled continuous variable set to the least value its rows allow."""
        out = {v: int(round(val)) for v, val in values.items() if v not in self.cont_scale}
        for v in self.cont_scale:
            need = 0
            for coeffs, sense, rhs in self.rows:
                a = coeffs.get(v, 0)
                if a < 0 and sense == "<=":
                    rest = sum(c * out.get(u, 0) for u, c in coeffs.items() if u != v)
                    need = max(need, -((rhs - rest) // -a))  # ceil((rest - rhs) / -a) in integers
            out[v] = min(max(need, 0), self.cont_ub[v])
        return out


def scale_model(lm: LinearModel, loose: bool = False) -> ScaledModel:
    """Integer copy of `lm`: tightened (every plan it accepts is real-feasible), or with
    `loose`, relaxed (it accepts every real-feasible plan, so its optimum bounds the real one)."""
    up, down = (math.floor, math.ceil) if loose else (math.ceil, math.floor)
    sm = ScaledModel()
    for v, var in lm.variables.items():
        if var.lb < 0:
            raise SolverError(f"cpsat: variable {v!r} has a negative lower bound; conservative rounding needs ≥ 0")
        if var.kind == "continuous" and v not in lm.products:
            sm.cont_scale[v] = 1.0
    group_of = {v: oh.name for oh in lm.onehots for v in oh.variables}
    for y, (a, b) in lm.products.items():
        group_of[y] = f"{group_of.get(a, a)}|{group_of.get(b, b)}"
    le_rows = []
    for c in lm.constraints:
        if c.sense == "==":
            if not all(float(a).is_integer() for a in c.coeffs.values()) or not float(c.rhs).is_integer():
                raise SolverError(f"cpsat: equality {c.name!r} has non-integer coefficients; it cannot be scaled safely")
            sm.rows.append(({v: int(a) for v, a in c.coeffs.items()}, "==", int(c.rhs)))
            continue
        sign = 1.0 if c.sense == "<=" else -1.0
        le_rows.append((c.name, {v: sign * a for v, a in c.coeffs.items()}, sign * c.rhs))
    cont_rows = {n for n, co, _ in le_rows if any(v in sm.cont_scale for v in co)}
    sm.S = min((_scale(co.values()) for n, co, _ in le_rows if n in cont_rows), default=1.0)
    for v in sm.cont_scale:
        sm.cont_scale[v] = sm.S
        sm.cont_ub[v] = min(_BIG, math.ceil(_cont_upper(lm, v, le_rows) * sm.S) + 1)
    for row_name, coeffs, rhs in le_rows:
        s = sm.S if row_name in cont_rows else _scale(coeffs.values())
        ints, worst = {}, {}
        for v, a in coeffs.items():
            if v in sm.cont_scale:
                ints[v] = up(a)
                slack = abs(ints[v] - a) * sm.cont_ub[v] / s
            else:
                ints[v] = up(a * s)
                slack = abs(ints[v] - a * s) * lm.variables[v].ub / s
            key = group_of.get(v, v)
            worst[key] = max(worst.get(key, 0.0), slack)
        b = down(rhs * s)
        sm.rows.append((ints, "<=", b))
        sm.row_error[row_name] = sum(worst.values()) + abs(rhs * s - b) / s
        sm.row_error_rel[row_name] = sm.row_error[row_name] / max(abs(a) for a in coeffs.values())
    obj_cont = [v for v in lm.objective if v in sm.cont_scale]
    sm.s_obj = sm.S if obj_cont else _scale(lm.objective.values(), OBJECTIVE_BITS)
    worst = {}
    for v, a in lm.objective.items():
        if v in sm.cont_scale:
            sm.objective[v] = round(a)
            err = abs(sm.objective[v] - a) * sm.cont_ub[v] / sm.s_obj
            err += abs(a) * max((sm.row_error[n] for n, co, _ in le_rows if v in co), default=0.0)
        else:
            sm.objective[v] = round(a * sm.s_obj)
            err = abs(sm.objective[v] - a * sm.s_obj) * lm.variables[v].ub / sm.s_obj
        key = group_of.get(v, v)
        worst[key] = max(worst.get(key, 0.0), err)
    sm.objective_error = sum(worst.values())
    rounding = {}
    for v, a in lm.objective.items():
        if v in sm.cont_scale:  # plus one unit: a plan's T may need rounding up to the next integer
            err = abs(sm.objective[v] - a) * sm.cont_ub[v] + abs(sm.objective[v])
        else:
            err = abs(sm.objective[v] - a * sm.s_obj) * lm.variables[v].ub
        key = group_of.get(v, v)
        rounding[key] = max(rounding.get(key, 0.0), err)
    sm.objective_rounding = sum(rounding.values())
    """Most that rounding can move any plan's scaled objective (one choice per one-hot is 1)."""
    return sm


def _scale(coeffs, bits: int = SCALE_BITS) -> float:
    m = max((abs(a) for a in coeffs), default=0.0)
    return 1.0 if m == 0 else math.ldexp(1.0, bits - math.frexp(m)[1])


def _cont_upper(lm: LinearModel, v: str, le_rows) -> float:
    """The largest value any plan can force on `v` (its finite ub, else from its ≤ rows)."""
    ub = lm.variables[v].ub
    if math.isfinite(ub):
        return ub
    need = lm.variables[v].lb
    for _, coeffs, rhs in le_rows:
        a = coeffs.get(v, 0.0)
        if a < 0:
            most = sum(max(0.0, c) * lm.variables[u].ub for u, c in coeffs.items() if u != v)
            need = max(need, (most - rhs) / -a)
    if not math.isfinite(need):
        raise SolverError(f"cpsat: continuous variable {v!r} has no finite upper bound; give one")
    return need
