"""Balance one global batch over data-parallel ranks of unequal speed.

Minimise the slowest rank's Σ c(L)/speed, subject to a per-rank token cap and, where asked,
equal sample counts (within one when the batch does not divide). Costs are made integers
first (w[i][r] = round(c_i·Q / s_r), Q putting the largest weight near 2**20), so every
stage compares integers: the same inputs give the same assignment on every rank and run.

Stages: speed-aware LPT (a heap per rank class, O(N log N + N log K)) and, on small batches,
speed-aware Karmarkar-Karp (pure, deterministic, stable tie-breaks on index), the better of them
refined by a local search that stops once the lower bound proves it within `LS_GAP`, and
MULTIFIT and a wider local search where that is still `MULTIFIT_GAP` above the bound: the best
as the warm start and the fallback; then the exact program on the shared problem IR
(`qsync_opt.solver.problem`): x[i,r] binary, one-hot per sample, an epigraph T ≥ load_r, cap and
count rows, rows ordering the loads of identical ranks (symmetry), min T, solvable by every exact
backend. The lower bound (`lower_bound`: area, single-sample and counting bounds) decides whether
the exact stage can win anything; it runs only then, and only within the call's time limit, model
building included. Its answer replaces the heuristic only when proven optimal (one thread, fixed
seed, so that the replacement is the same on every run), unless `accept_incumbent`.
"""

from __future__ import annotations

import time
from typing import NamedTuple

from qsync_opt.errors import InfeasibleError, SpecError
from qsync_opt.loading.balance_exact import build_problem, load_solver, solve_exact
from qsync_opt.loading.balance_heuristics import fit_within, karmarkar_karp, kk_parts, lpt, multifit, stride
from qsync_opt.loading.balance_search import LS_GAP, improve, improve_wide
from qsync_opt.loading.balance_model import (
    WEIGHT_BITS,
    Instance,
    Result,
    area_bound,
    counting_bound,
    feasible,
    large_area_bound,
    loads_np,
    loads_of,
    lower_bound,
    make_instance,
    result_of,
    single_bound,
)

__all__ = ["EXACT_BUILD_S_PER_CELL", "KK_MAX_CELLS", "LS_GAP", "MULTIFIT_GAP", "MULTIFIT_PROBES", "STOP_MARGIN",
           "WEIGHT_BITS", "Instance", "Result", "area_bound", "balance", "build_problem", "counting_bound",
           "exact_build_estimate_s", "feasible", "fit_within", "improve", "karmarkar_karp", "kk_parts",
           "large_area_bound", "loads_of", "lower_bound", "lpt", "make_instance", "multifit", "single_bound",
           "solve_exact", "stride"]

KK_MAX_CELLS = 4_096
"""Karmarkar-Karp runs when samples x ranks is at most this: it keeps a K-slot partial solution
per sample (O(N·K log K)), cheap on small batches, where it can beat LPT; above, LPT with the
local search, MULTIFIT and the wide local search take its place (benchmarks/balance_scale.py
compares their plans with today's KK and LPT)."""
EXACT_BUILD_S_PER_CELL = 2e-5
"""Seconds per (sample, rank) cell to build and load the exact program (a generous estimate on one
CPU core): `exact_build_estimate_s`."""

STOP_MARGIN = 0.1
"""Share of the time limit kept back from the exact solver for its stop latency and the result's decoding."""

MULTIFIT_GAP = 1e-3
"""When the local search ends further than this above the lower bound, MULTIFIT (best-fit
decreasing under a bisected capacity) is tried too: it packs a few large samples with many small
ones where LPT gives every rank the same number of large ones (bimodal lengths)."""
MULTIFIT_PROBES = 8
"""Capacities MULTIFIT tries at most (each one pass over the samples)."""

_clock = time.perf_counter  # the wall clock every stage reads (tests replace it)


def exact_build_estimate_s(inst: Instance) -> float:
    """What building the exact program is expected to cost (from the instance's size alone)."""
    return EXACT_BUILD_S_PER_CELL * inst.n * inst.k


class Candidate(NamedTuple):
    """A heuristic's assignment, ordered as `balance` prefers them: the lower makespan, then the earlier stage."""

    makespan: int
    stage: int
    """Tie-break among equal makespans: 0 kk, 1 lpt, 2 multifit, 3 the wide search."""
    method: str
    owner: list[int]
    """Sample -> rank."""


def _makespan(inst: Instance, owner) -> int:
    return int(loads_np(inst, owner).max()) if inst.k else 0


def balance(inst: Instance, *, backend: str | None = "highs", time_limit_s: float = 0.05,
            work_limit: float | None = None, accept_incumbent: bool = False, gap_tol: float = 0.0,
            min_gain: float = 0.0) -> Result:
    """Best of KK (small batches) and LPT, refined by `improve`; where that is not within
    `MULTIFIT_GAP` of the bound, MULTIFIT (no caps or count rule) and then `improve_wide` from the
    same start too, the best of them; then the exact program.

    `time_limit_s` bounds the whole call's wall clock (heuristics, model building and solve):
    LPT, KK and the fast local search always run (deterministic, bounded by their step budgets);
    MULTIFIT and the wide search stop at the limit (then `detail['time_limited']`, as a rerun
    may plan differently); the exact stage starts only when its expected build time (`exact_build_estimate_s`) fits in
    half the limit (a test on the instance alone) and in what is left of it once the solver is
    imported (the wall clock; a skip for that reason sets `detail['time_limited']`), and its
    solver gets what is left, less `STOP_MARGIN` of the limit.
    The exact stage is skipped when the heuristic is proven within `gap_tol` of the lower
    bound, or when the most it could win, the heuristic's slowest load less the lower bound,
    is at most `min_gain` (in the costs' unit: with costs in seconds, what the exact stage
    would cost on the critical path). These tests compare numbers derived from the instance
    alone, so the choice is the same on every run. Its answer replaces the heuristic's when proven optimal, or, with
    `accept_incumbent`, whenever it is better. `work_limit` (CP-SAT's deterministic seconds,
    one thread) makes a stopped run reproducible: its incumbent is then accepted too, unless
    the wall-clock backstop stopped it first (then the deterministic heuristic stands, and
    `detail['time_limited']` says so). `detail['exact_skipped']` says why the stage did not run.
    """
    t0 = _clock()
    deadline = t0 + time_limit_s
    lb = lower_bound(inst)
    cands = []
    detail: dict = {"kk": None, "lpt": None}
    if inst.n * inst.k <= KK_MAX_CELLS:
        kk = karmarkar_karp(inst)
        if feasible(inst, kk):
            detail["kk"] = _makespan(inst, kk)
            cands.append(Candidate(detail["kk"], 0, "kk", kk))
    lp = lpt(inst)
    if lp is not None:
        detail["lpt"] = _makespan(inst, lp)
        cands.append(Candidate(detail["lpt"], 1, "lpt", lp))
    best = min(cands) if cands else None
    start = best
    if best is not None and best.makespan > lb:
        o = improve(inst, best.owner, lower=lb, gap=LS_GAP)
        best = Candidate(_makespan(inst, o), best.stage, best.method + "+ls", o)
    elif best is not None:
        best = best._replace(method=best.method + "+ls")
    free = not inst.equal_counts and all(c is None for c in inst.caps)
    spent = []  # the optional stages stop at the time limit; a plan they shaped is then flagged

    def late() -> bool:
        if _clock() >= deadline:
            spent.append(True)
        return bool(spent)

    if best is not None and free and best.makespan - lb > MULTIFIT_GAP * best.makespan:
        mf = multifit(inst, lb, best.makespan, probes=MULTIFIT_PROBES, gap=LS_GAP, stop=late)
        if mf is not None:
            mf = improve(inst, mf, lower=lb, gap=LS_GAP)
            detail["multifit"] = _makespan(inst, mf)
            if detail["multifit"] < best.makespan:
                best = Candidate(detail["multifit"], 2, "multifit+ls", mf)
    if best is not None and best.makespan - lb > MULTIFIT_GAP * best.makespan:
        wide = improve_wide(inst, start.owner, lower=lb, gap=LS_GAP, stop=late)
        detail["wide"] = _makespan(inst, wide)
        if detail["wide"] < best.makespan:
            best = Candidate(detail["wide"], 3, start.method + "+wide", wide)
    if spent:
        detail["time_limited"] = True  # MULTIFIT or the wide search stopped at the time limit

    def done(owner, method, status, bound):
        r = result_of(inst, owner, method, status, bound, **detail)
        r.plan_s = _clock() - t0
        return r

    if best is not None and (best.makespan <= lb or (best.makespan - lb) <= gap_tol * best.makespan
                             or (best.makespan - lb) * inst.scale <= min_gain):
        if best.makespan > lb and (best.makespan - lb) > gap_tol * best.makespan:
            detail["exact_skipped"] = "gain below min_gain"
        return done(best.owner, best.method, "optimal" if best.makespan <= lb else "feasible", lb)
    if backend is not None and inst.n > 0:
        if work_limit is not None and backend != "cpsat":
            raise SpecError(f"balance: a deterministic work limit needs backend cpsat, got {backend!r}")
        build_s = exact_build_estimate_s(inst)
        if build_s > 0.5 * time_limit_s:
            detail["exact_skipped"] = (f"model too large for the time limit: {inst.n} x {inst.k} cells, about "
                                       f"{build_s:.3g} s to build, limit {time_limit_s:.3g} s")
        else:
            load_solver(backend)  # a process's first import of the solver counts against the limit
            if deadline - _clock() < build_s:
                detail.update(exact_skipped="time limit spent before the exact stage", time_limited=True)
            else:
                # the solver's own deadline comes STOP_MARGIN of the limit early: a stop request takes effect late
                solve_by = deadline - STOP_MARGIN * time_limit_s
                warm = best.owner if best else None
                owner, status, bound, raw = solve_exact(inst, backend, solve_by - _clock(), warm, work_limit=work_limit,
                                                        lower=lb, deadline=solve_by, clock=_clock)
                wall = raw.wall_s if raw is not None else 0.0
                time_limited = status != "optimal" and (raw is None or _clock() >= solve_by - 0.05 * time_limit_s)
                detail.update(exact_status=status, exact_s=wall, backend=backend,
                              time_limited=time_limited or bool(detail.get("time_limited")))
                lb = max(lb, bound)
                take = (status == "optimal" or accept_incumbent or best is None
                        or (work_limit is not None and not time_limited))
                if owner is not None and take and (best is None or max(loads_of(inst, owner)) <= best.makespan):
                    m = max(loads_of(inst, owner))
                    return done(owner, backend, "optimal" if status == "optimal" or m <= lb else "feasible", lb)
                if best is None and status == "infeasible":
                    raise InfeasibleError(
                        "balance: no assignment of this global batch meets the per-rank token cap and count rule",
                        [f"largest sample {max(inst.tokens)} tokens, caps {list(inst.caps)}, "
                         f"total {sum(inst.tokens)} tokens",
                         "raise data.token_cap or lower the global batch"])
    if best is None:
        raise InfeasibleError("balance: the heuristics found no assignment within the token cap and the exact "
                              "stage is off or stopped without one",
                              [f"caps {list(inst.caps)}, total {sum(inst.tokens)} tokens over {inst.k} ranks",
                               "raise data.token_cap, lower the global batch, or give the exact stage more time"])
    return done(best.owner, best.method, "optimal" if best.makespan <= lb else "feasible", lb)
