"""Shared helpers for the solver tests: backend parametrisation and the brute-force referee."""

from __future__ import annotations

import pytest

from qsync_opt.errors import InfeasibleError
from qsync_opt.solver.backends import BACKENDS, EXACT, available
from qsync_opt.training.program.instance import evaluate
from qsync_opt.training.program.solve import solve_instance

AVAILABLE = available()
N_SMALL = 240
"""Random small instances every exact backend is checked on (≥ 200 asked)."""


def backend_params(names=None):
    """pytest params over backends, skipped (not failed) where the solver is not installed."""
    names = list(names or BACKENDS)
    return [pytest.param(n, id=n, marks=pytest.mark.skipif(not AVAILABLE[n], reason=f"{n} not available")) for n in names]


def exact_params():
    return backend_params(EXACT)


def rel_close(a: float, b: float, rel: float = 1e-6, abs_: float = 1e-9) -> bool:
    return abs(a - b) <= rel * max(abs(a), abs(b)) + abs_


def optimum_and_bound_mismatches(backend, cases, time_limit_s: float) -> list[str]:
    """Solve each (seed, instance, brute force) without the tie-break; describe every case whose
    status, optimum or proven bound disagrees with brute force."""
    bad = []
    for seed, inst, br in cases:
        try:
            r = solve_instance(inst, backend=backend, rel_gap=0.0, time_limit_s=time_limit_s, threads=1, tie_break=False)
        except InfeasibleError:
            if br.status != "infeasible":
                bad.append(f"seed {seed}: infeasible, brute force {br.objective:.9g}")
            continue
        if br.status != "optimal" or r.status != "optimal" or not rel_close(r.objective, br.objective, 1e-6, 1e-12):
            bad.append(f"seed {seed}: {r.status} {r.objective:.9g} vs brute force {br.status} {br.objective}")
        if r.bound is None or r.bound > br.objective * (1 + 1e-6) + 1e-12:
            bad.append(f"seed {seed}: bound {r.bound} above the optimum {br.objective:.9g}")
    return bad


def check_against_brute_force(backend, cases, formulation="mccormick") -> list[str]:
    """Solve each case through solve_instance; describe every way it differs from brute force."""
    problems = []
    for seed, inst, br in cases:
        try:
            r = solve_instance(inst, backend=backend, rel_gap=0.0, time_limit_s=30, threads=1, formulation=formulation)
        except InfeasibleError as e:
            if br.status != "infeasible":
                problems.append(f"seed {seed}: reported infeasible, brute force found {br.objective:.9g}")
            elif not _names_group_and_bound(e.diagnosis, inst):
                problems.append(f"seed {seed}: diagnosis does not name a group and bound: {e.diagnosis}")
            continue
        if br.status == "infeasible":
            problems.append(f"seed {seed}: returned a plan ({r.objective:.9g}) for an infeasible instance")
            continue
        ev = evaluate(inst, r.assignment)
        if not ev.feasible:
            problems.append(f"seed {seed}: plan breaks the instance: {ev.violations}")
        tol = 2 * r.scaling["objective_error"] if r.scaling else 0.0
        if r.objective < br.objective - 1e-9 * max(1.0, abs(br.objective)) - tol:
            problems.append(f"seed {seed}: objective {r.objective:.12g} beats the brute-force optimum {br.objective:.12g}")
        if not rel_close(r.objective, br.objective, abs_=1e-9 + tol):
            problems.append(f"seed {seed}: objective {r.objective:.12g} != optimum {br.objective:.12g} (tol {tol:.2g})")
        if r.status != "optimal":
            problems.append(f"seed {seed}: status {r.status} without a time limit being hit")
    return problems


def _names_group_and_bound(diagnosis, inst) -> bool:
    names = {g.name for g in inst.groups}
    for line in diagnosis:
        head = line.split(":")[0]
        if (head in names and any(w in line for w in ("time", "memory"))) or head == "indicator budget":
            return True
    return False
