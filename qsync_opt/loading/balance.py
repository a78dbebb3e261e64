"""Balance one global batch over data-parallel ranks of unequal speed.

Minimise the slowest rank's Σ c(L)/speed, subject to a per-rank token cap and, where asked,
equal sample counts (within one when the batch does not divide). Costs are made integers
first (w[i][r] = round(c_i·Q / s_r), Q putting the largest weight near 2**20), so every
stage compares integers: the same inputs give the same assignment on every rank and run.

Stages: speed-aware Karmarkar-Karp and speed-aware LPT (pure, deterministic, stable
tie-breaks on index), the better of them as the warm start and the fallback; then the exact
program on the shared problem IR (`qsync_opt.solver.problem`): x[i,r] binary, one-hot per
sample, an epigraph T ≥ load_r, cap and count rows, rows ordering the loads of identical
ranks (symmetry), min T, solvable by every exact backend. The program runs under a time
limit; its answer replaces the heuristic only when proven optimal (one thread, fixed seed,
so that the replacement is the same on every run), unless `accept_incumbent`.
"""

from __future__ import annotations

import time

from qsync_opt.errors import InfeasibleError, SpecError
from qsync_opt.loading.balance_exact import build_problem, solve_exact
from qsync_opt.loading.balance_heuristics import (
    improve,
    karmarkar_karp,
    kk_parts,
    lpt,
    stride,
)
from qsync_opt.loading.balance_model import (
    WEIGHT_BITS,
    Instance,
    Result,
    _result,
    feasible,
    loads_of,
    lower_bound,
    make_instance,
)

__all__ = ["WEIGHT_BITS", "Instance", "Result", "balance", "build_problem", "feasible", "improve", "karmarkar_karp",
           "kk_parts", "loads_of", "lower_bound", "lpt", "make_instance", "solve_exact", "stride"]


def balance(inst: Instance, *, backend: str | None = "highs", time_limit_s: float = 0.05,
            work_limit: float | None = None, accept_incumbent: bool = False, gap_tol: float = 0.0,
            min_gain: float = 0.0) -> Result:
    """Best of KK and LPT (the better one refined by `improve`), then the exact program.

    The exact stage is skipped when the heuristic is proven within `gap_tol` of the lower
    bound, or when the most it could win, the heuristic's slowest load less the lower bound,
    is at most `min_gain` (in the costs' unit: with costs in seconds, what the exact stage
    would cost on the critical path). Both tests compare numbers derived from the instance
    alone, so the choice is the same on every run. Its answer replaces the heuristic's when proven optimal, or, with
    `accept_incumbent`, whenever it is better. `work_limit` (CP-SAT's deterministic seconds,
    one thread) makes a stopped run reproducible: its incumbent is then accepted too, unless
    the wall-clock backstop `time_limit_s` stopped it first (then the deterministic
    heuristic stands, and `detail['time_limited']` says so).
    """
    t0 = time.perf_counter()
    lb = lower_bound(inst)
    cands = []
    kk = karmarkar_karp(inst)
    if feasible(inst, kk):
        cands.append((max(loads_of(inst, kk)), 0, "kk", kk))
    lp = lpt(inst)
    if lp is not None:
        cands.append((max(loads_of(inst, lp)), 1, "lpt", lp))
    detail: dict = {"kk": next((c[0] for c in cands if c[2] == "kk"), None),
                    "lpt": next((c[0] for c in cands if c[2] == "lpt"), None)}
    best = min(cands) if cands else None
    if best is not None:
        o = improve(inst, best[3])
        best = (max(loads_of(inst, o)), best[1], best[2] + "+ls", o)

    def done(owner, method, status, bound):
        r = _result(inst, owner, method, status, bound, **detail)
        r.plan_s = time.perf_counter() - t0
        return r

    if best is not None and (best[0] <= lb or (best[0] - lb) <= gap_tol * best[0]
                             or (best[0] - lb) * inst.scale <= min_gain):
        if best[0] > lb and (best[0] - lb) > gap_tol * best[0]:
            detail["exact_skipped"] = "gain below min_gain"
        return done(best[3], best[2], "optimal" if best[0] <= lb else "feasible", lb)
    if backend is not None and inst.n > 0:
        if work_limit is not None and backend != "cpsat":
            raise SpecError(f"balance: a deterministic work limit needs backend cpsat, got {backend!r}")
        owner, status, bound, raw = solve_exact(inst, backend, time_limit_s, best[3] if best else None,
                                                work_limit=work_limit)
        time_limited = raw.wall_s >= 0.95 * time_limit_s and status != "optimal"
        detail.update(exact_status=status, exact_s=raw.wall_s, backend=backend, time_limited=time_limited)
        lb = max(lb, bound)
        take = status == "optimal" or accept_incumbent or best is None or (work_limit is not None and not time_limited)
        if owner is not None and take and (best is None or max(loads_of(inst, owner)) <= best[0]):
            m = max(loads_of(inst, owner))
            return done(owner, backend, "optimal" if status == "optimal" or m <= lb else "feasible", lb)
        if best is None and status == "infeasible":
            raise InfeasibleError(
                "balance: no assignment of this global batch meets the per-rank token cap and count rule",
                [f"largest sample {max(inst.tokens)} tokens, caps {list(inst.caps)}, total {sum(inst.tokens)} tokens",
                 "raise data.token_cap or lower the global batch"])
    if best is None:
        raise InfeasibleError("balance: the heuristics found no assignment within the token cap and the exact "
                              "stage is off or stopped without one",
                              [f"caps {list(inst.caps)}, total {sum(inst.tokens)} tokens over {inst.k} ranks",
                               "raise data.token_cap, lower the global batch, or give the exact stage more time"])
    return done(best[3], best[2], "optimal" if best[0] <= lb else "feasible", lb)
