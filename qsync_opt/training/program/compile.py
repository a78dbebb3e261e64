"""Training compiler: TrainingInstance -> Problem (QSync's precision choice as an integer program).

Variables: x[g, i, p] = 1 iff op i runs at precision p in group g, one-hot per (g, i). A cast
on edge (a, b) costs c[pa, pb] only when both ends take that pair, so it is the product
x[g, a, pa]·x[g, b, pb], kept as a PairTerm (see backends/linear.py for why its
linearisation is exact). Ops with a single allowed precision are folded into constants,
and a cast next to such an op becomes a plain linear term, so a fully fixed group adds
no variables at all.

Rows per group: time (fixed + Σ t·x + Σ c·y ≤ bound) when the group has a bound, and one more
such row per sync row (the lockstep iteration's bucket terms, instance.TimeRow); memory
(fixed + Σ m·x ≤ capacity) when the capacity is finite; the share-weighted indicator
budget when the instance has one. Objective "accuracy_degradation" minimises
Σ_g share_g Σ_i ω[i, p]·x; "iteration_time" minimises T with T ≥ every time row of every group.
Memory and indicator rows are rescaled by powers of two (exact in floating point) so bytes
and tiny indicators do not meet solver tolerances in raw form.
"""

from __future__ import annotations

import math
import re

from qsync_opt.errors import SpecError
from qsync_opt.precision import PRECISIONS
from qsync_opt.training.program import instance_io  # noqa: F401  (problem files carry training instances)
from qsync_opt.training.program.instance import GroupInstance, TrainingInstance
from qsync_opt.solver.problem import Problem

OBJECTIVES = ("accuracy_degradation", "iteration_time")


def compile_training(instance: TrainingInstance) -> Problem:
    """The integer program of `instance`; `problem.decode(values)` gives back an Assignment."""
    check_instance(instance)
    prob = Problem(name="qsync_training", source=instance, meta={"kind": "training", "objective": instance.objective})
    names = _Names()
    deg_expr: dict[str, float] = {}
    deg_const = 0.0
    times: list[tuple[GroupInstance, str, dict[str, float], float]] = []
    for g in instance.groups:
        gname = names.group(g.name)
        x: dict[tuple[str, str], str] = {}
        fixed = {op: allowed[0] for op, allowed in g.allowed.items() if len(allowed) == 1}
        if fixed:
            prob.fixed[g.name] = fixed
        t_expr, m_expr = {}, {}
        t_const, m_const = g.fixed_ms, g.fixed_mem_bytes
        for op, allowed in g.allowed.items():
            if op in fixed:
                p = fixed[op]
                t_const += g.time_ms[op][p]
                m_const += g.mem_bytes[op][p]
                deg_const += g.share * instance.omega[op][p]
                continue
            vars_ = []
            for p in allowed:
                v = prob.add_var(f"x_{gname}__{names.op(op)}__{p}")
                prob.choices[v] = (g.name, op, p)
                x[op, p] = v
                vars_.append(v)
                _acc(t_expr, v, g.time_ms[op][p])
                _acc(m_expr, v, g.mem_bytes[op][p])
                _acc(deg_expr, v, g.share * instance.omega[op][p])
            prob.add_onehot(f"oh_{gname}__{names.op(op)}", vars_)
        pairs: set[str] = set()

        def add_casts(cast_ms, t_expr, t_const) -> float:
            for (a, b), table in cast_ms.items():
                for (pa, pb), c in table.items():
                    if c == 0 or pa not in g.allowed[a] or pb not in g.allowed[b]:
                        continue
                    if a in fixed and b in fixed:
                        t_const += c if (fixed[a], fixed[b]) == (pa, pb) else 0.0
                    elif a in fixed:
                        _acc(t_expr, x[b, pb], c if fixed[a] == pa else 0.0)
                    elif b in fixed:
                        _acc(t_expr, x[a, pa], c if fixed[b] == pb else 0.0)
                    else:
                        y = f"y_{gname}__{names.op(a)}__{names.op(b)}__{pa}__{pb}"
                        if y not in pairs:  # one product variable per pair, shared by every row
                            prob.add_pair(y, x[a, pa], x[b, pb])
                            pairs.add(y)
                        _acc(t_expr, y, c)
            return t_const

        t_const = add_casts(g.cast_ms, t_expr, t_const)
        rows = [("time", t_expr, t_const)]
        for k, row in enumerate(g.sync_rows):  # the lockstep iteration's other terms (TimeRow)
            r_expr, r_const = {}, row.const_ms
            for op, table in row.op_ms.items():
                for p, c in table.items():
                    if op in fixed:
                        r_const += c if fixed[op] == p else 0.0
                    elif (op, p) in x:
                        _acc(r_expr, x[op, p], c)
            rows.append((f"sync{k}", r_expr, add_casts(row.cast_ms, r_expr, r_const)))
        for label, expr, const in rows:
            if g.time_bound_ms is not None:
                prob.add_constraint(f"{label}_{gname}", expr, "<=", g.time_bound_ms - const)
            times.append((g, label, expr, const))
        if math.isfinite(g.mem_capacity_bytes):
            prob.add_constraint(f"mem_{gname}", *_pow2_row(m_expr, g.mem_capacity_bytes - m_const))
    if instance.max_degradation is not None:
        prob.add_constraint("degradation_budget", *_pow2_row(deg_expr, instance.max_degradation - deg_const))
    if instance.objective == "accuracy_degradation":
        scale = _pow2_scale(deg_expr.values(), target=OBJECTIVE_MAX)
        prob.objective = {v: c * scale for v, c in deg_expr.items()}
        prob.objective_constant = deg_const * scale
        prob.objective_unit = 1.0 / scale
    else:
        t = prob.add_var("T_iteration", "continuous", 0.0, math.inf)  # T ≥ every group's time
        for g, label, t_expr, t_const in times:
            tag = "" if label == "time" else f"_{label}"
            prob.add_constraint(f"epi_{names.group(g.name)}{tag}", {**t_expr, t: -1.0}, "<=", -t_const)
        prob.objective = {t: 1.0}
    prob.meta["groups"] = [g.name for g in instance.groups]
    return prob


def check_instance(instance: TrainingInstance) -> None:
    """Raise SpecError naming the field, the value and the fix for the first bad entry."""
    if instance.objective not in OBJECTIVES:
        raise SpecError(f"objective: {instance.objective!r} is unknown; use one of {', '.join(OBJECTIVES)}")
    if instance.max_degradation is not None and not _finite(instance.max_degradation):
        raise SpecError(f"max_degradation: {instance.max_degradation!r} is not a finite number; give one or None")
    if not instance.groups:
        raise SpecError("groups: empty; give at least one device group")
    seen = set()
    for g in instance.groups:
        where = f"groups[{g.name}]"
        if g.name in seen:
            raise SpecError(f"{where}: group name used twice; group names must be unique")
        seen.add(g.name)
        if not _finite(g.share) or g.share < 0:
            raise SpecError(f"{where}.share: {g.share!r}; must be a finite number ≥ 0")
        for label, v in (("fixed_ms", g.fixed_ms), ("fixed_mem_bytes", g.fixed_mem_bytes)):
            if not _finite(v):
                raise SpecError(f"{where}.{label}: {v!r} is not a finite number")
        if g.time_bound_ms is not None and not _finite(g.time_bound_ms):
            raise SpecError(f"{where}.time_bound_ms: {g.time_bound_ms!r}; give a finite bound or None")
        if math.isnan(g.mem_capacity_bytes):
            raise SpecError(f"{where}.mem_capacity_bytes: NaN; give a number of bytes or math.inf")
        for op, allowed in g.allowed.items():
            if not allowed:
                raise SpecError(f"{where}.allowed[{op!r}]: empty; allow at least one precision")
            for p in allowed:
                if p not in PRECISIONS:
                    raise SpecError(f"{where}.allowed[{op!r}]: unknown precision {p!r}; known: {', '.join(PRECISIONS)}")
                for label, table in (("time_ms", g.time_ms), ("mem_bytes", g.mem_bytes), ("omega", instance.omega)):
                    v = table.get(op, {}).get(p)
                    if v is None or not _finite(v):
                        field = f"{where}.{label}" if label != "omega" else "omega"
                        raise SpecError(f"{field}[{op!r}][{p!r}]: {v!r}; give a finite number for every allowed precision")
        for (a, b), table in g.cast_ms.items():
            for op in (a, b):
                if op not in g.allowed:
                    raise SpecError(f"{where}.cast_ms[({a!r}, {b!r})]: op {op!r} is not in this group's ops; drop the edge or add the op")
            for pair, c in table.items():
                if not _finite(c):
                    raise SpecError(f"{where}.cast_ms[({a!r}, {b!r})][{pair}]: {c!r} is not a finite number")
        for k, row in enumerate(g.sync_rows):
            at = f"{where}.sync_rows[{k}] ({row.name})"
            if not _finite(row.const_ms):
                raise SpecError(f"{at}.const_ms: {row.const_ms!r} is not a finite number")
            ops = list(row.op_ms) + [op for edge in row.cast_ms for op in edge]
            stray = [op for op in ops if op not in g.allowed]
            if stray:
                raise SpecError(f"{at}: op {stray[0]!r} is not in this group's ops; drop it or add the op")
            values = [c for t in row.op_ms.values() for c in t.values()] + [c for t in row.cast_ms.values() for c in t.values()]
            if not all(_finite(c) for c in values):
                raise SpecError(f"{at}: a coefficient is not a finite number; give finite ms")


class _Names:
    """Readable, solver-safe, unique names: 'layer1.0.conv1' -> 'layer1_0_conv1'.

    Runs of anything but letters and digits become one '_', so '__' can separate the parts
    of a variable name (x_<group>__<op>__<precision>) without ambiguity.
    """

    def __init__(self):
        self._ops: dict[str, str] = {}
        self._groups: dict[str, str] = {}
        self._used: dict[int, set[str]] = {id(self._ops): set(), id(self._groups): set()}

    def op(self, name: str) -> str:
        return self._ops.get(name) or self._get(self._ops, name)

    def group(self, name: str) -> str:
        return self._groups.get(name) or self._get(self._groups, name)

    def _get(self, table: dict[str, str], name: str) -> str:
        used = self._used[id(table)]  # kept beside the table: rebuilding it per name would be O(n²)
        base = re.sub(r"[^A-Za-z0-9]+", "_", name).strip("_") or "op"
        cand, k = base, 1
        while cand in used:
            k += 1
            cand = f"{base}_{k}"
        table[name] = cand
        used.add(cand)
        return cand


def _acc(expr: dict[str, float], var: str, c: float) -> None:
    if c:
        expr[var] = expr.get(var, 0.0) + c


OBJECTIVE_MAX = 2.0**20
"""Largest objective coefficient after scaling. Indicators span many decades (int4 ~1e-2,
fp16 ~1e-9 per op); with the largest at 1, the fp16 terms fell under HiGHS's and CBC's
absolute tolerances (~1e-7) and both declared 2.7%-worse ResNet-50 plans optimal. At 2**20
the smallest terms that matter stay well above those tolerances."""


def _pow2_scale(coeffs, target: float = 1.0) -> float:
    """2**k with max |coeff|·2**k in [target, 2·target); 1.0 when there are no coefficients.

    A power of two scales exactly in floating point, so the optimum is unchanged."""
    m = max((abs(c) for c in coeffs), default=0.0)
    return 1.0 if m == 0 else math.ldexp(1.0, -math.frexp(m / target)[1] + 1)


def _pow2_row(coeffs: dict[str, float], rhs: float):
    s = _pow2_scale(coeffs.values())
    return {v: c * s for v, c in coeffs.items()}, "<=", rhs * s


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v)
