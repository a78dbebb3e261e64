"""The exact balance program on the shared problem IR (qsync_opt.solver.problem): x[i,r] binary,
one-hot per sample, an epigraph T ≥ load_r, cap and count rows, symmetry rows ordering the loads of
identical ranks, min T; solved by one exact backend with a canonical relabelling of identical ranks."""

from __future__ import annotations

import math
import time

from qsync_opt.errors import SolverError
from qsync_opt.loading.balance_model import Instance, feasible, loads_of, lower_bound
from qsync_opt.solver.backends import get_backend
from qsync_opt.solver.backends.base import SolveOptions
from qsync_opt.solver.problem import Problem


def build_problem(inst: Instance, upper: int | None = None, lower: int = 0):
    """The min-max program on the shared IR; `choices` decode to {'batch': {sample: rank}}."""
    p = Problem("balance")
    x = [[p.add_var(f"x_{i}_{r}") for r in range(inst.k)] for i in range(inst.n)]
    for i in range(inst.n):
        for r in range(inst.k):
            p.choices[x[i][r]] = ("batch", str(i), str(r))
        p.add_onehot(f"one_{i}", x[i])
    T = p.add_var("T", "continuous", lb=float(lower), ub=math.inf if upper is None else float(upper))
    for r in range(inst.k):
        row = {x[i][r]: float(inst.weights[i][r]) for i in range(inst.n)}
        row[T] = -1.0
        p.add_constraint(f"load_{r}", row, "<=", 0.0)
        if inst.caps[r] is not None:
            p.add_constraint(f"cap_{r}", {x[i][r]: float(inst.tokens[i]) for i in range(inst.n)}, "<=", float(inst.caps[r]))
    lo, hi = inst.count_range()
    if inst.equal_counts:
        for r in range(inst.k):
            cnt = {x[i][r]: 1.0 for i in range(inst.n)}
            if lo == hi:
                p.add_constraint(f"count_{r}", cnt, "==", float(lo))
            else:
                p.add_constraint(f"count_lo_{r}", cnt, ">=", float(lo))
                p.add_constraint(f"count_hi_{r}", cnt, "<=", float(hi))
    # identical ranks (same weights column and cap) are interchangeable: order their loads
    cols = {}
    for r in range(inst.k):
        cols.setdefault((tuple(inst.weights[i][r] for i in range(inst.n)), inst.caps[r]), []).append(r)
    for same in cols.values():
        for r1, r2 in zip(same, same[1:]):
            row = {x[i][r1]: float(inst.weights[i][r1]) for i in range(inst.n)}
            for i in range(inst.n):
                row[x[i][r2]] = row.get(x[i][r2], 0.0) - float(inst.weights[i][r2])
            p.add_constraint(f"sym_{r1}_{r2}", row, ">=", 0.0)
    p.objective = {T: 1.0}
    p.meta["kind"] = "balance"
    return p


def load_solver(backend: str) -> bool:
    """Import the backend's solver now (its `available()`; a process's first import of OR-Tools
    takes seconds): the data plane does it when it starts, `balance` before it reads the time left."""
    return bool(get_backend(backend).available())


def _canonical(inst: Instance, owner: list[int]) -> list[int]:
    """Relabel identical ranks so their loads are in non-increasing order (the symmetry rows)."""
    cols: dict = {}
    for r in range(inst.k):
        cols.setdefault((tuple(inst.weights[i][r] for i in range(inst.n)), inst.caps[r]), []).append(r)
    loads = loads_of(inst, owner)
    remap = list(range(inst.k))
    for same in cols.values():
        by_load = sorted(same, key=lambda r: (-loads[r], r))
        for dst, src in zip(same, by_load):
            remap[src] = dst
    return [remap[r] for r in owner]


def solve_exact(inst: Instance, backend: str = "highs", time_limit_s: float = 1.0,
                start: list[int] | None = None, threads: int = 1, work_limit: float | None = None,
                lower: int | None = None, deadline: float | None = None, clock=time.perf_counter):
    """(owner or None, status, bound, raw result or None) from one exact backend on the min-max
    program. With `deadline` (a `loading.balance._clock` reading), the solver gets what is left of
    it after the model is built and loaded (`SolveOptions.deadline`, which also stops a solver
    that overruns), and nothing is solved when the building used it all (status 'time_limit',
    raw None)."""
    lb = lower_bound(inst) if lower is None else int(lower)
    upper = max(loads_of(inst, start)) if start is not None else None
    p = build_problem(inst, upper=upper, lower=lb)
    hint = None
    if start is not None:
        start = _canonical(inst, start)
        hint = p.encode({"batch": {str(i): str(r) for i, r in enumerate(start)}})
    if deadline is not None:
        left = deadline - clock()
        if left <= 0:
            return None, "time_limit", lb, None
        time_limit_s = min(time_limit_s, left)
    ub = upper if upper is not None else sum(max(row) for row in inst.weights)
    # the backends' deadline is a time.perf_counter() instant: the model's loading into the solver counts too
    pc_deadline = None if deadline is None else time.perf_counter() + (deadline - clock())
    opts = SolveOptions(time_limit_s=time_limit_s, rel_gap=0.999 / max(ub, 1), threads=threads, seed=0, hint=hint,
                        deterministic_time_s=work_limit, deadline=pc_deadline)
    res = get_backend(backend).solve(p, opts)
    bound = lb
    if res.bound is not None and math.isfinite(res.bound):
        bound = max(bound, int(math.ceil(res.bound - 1e-6)))
    if res.values is None:
        return None, res.status, bound, res
    owner = [int(r) for _, r in sorted(((int(i), int(r)) for i, r in p.decode(res.values)["batch"].items()))]
    if not feasible(inst, owner):
        raise SolverError(f"balance: backend {backend} returned an assignment that breaks a cap or count row")
    return owner, res.status, bound, res
