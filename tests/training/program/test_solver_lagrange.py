"""The Lagrangian stage (lagrange_dp.py, lagrange.py, bounded.py) against enumeration.

The DP must be the exact minimum of its energy (and its min-marginals exact), the bound must
never exceed the brute-force optimum, the plan must keep both rows, and fixing must keep an
optimal plan: the reduced program's optimum equals the full one's.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import replace

import numpy as np
import pytest
from solver_cases import exact_params, optimum_and_bound_mismatches, rel_close

from qsync_opt.training.program.bounded import applies
from qsync_opt.training.program.brute import brute_force
from qsync_opt.training.program.instance import evaluate
from qsync_opt.training.program.lagrange import _Evaluator, group_arrays, solve_dual
from qsync_opt.training.program.random_instances import random_small, synthetic
from qsync_opt.training.program.solve import solve_instance


def one_group_cases(n: int = 60):
    """Small one-group instances with the indicator objective: casts (some negative), both rows."""
    out = []
    for seed in range(n):
        inst = random_small(seed, n_groups=1, n_precisions=3, objective="accuracy_degradation")
        if applies(inst):
            out.append((seed, inst))
    return out


def energy_brute(ga, lam):
    """min and min-marginals of the Lagrangian energy by enumeration."""
    ev = _Evaluator(ga)
    choices = [range(len(a)) for a in ga.allowed]
    xs = np.array(list(itertools.product(*choices)))
    part = ev.parts(xs)
    e = part[:, 0] + lam[0] * part[:, 1] + lam[1] * part[:, 2]
    mm = np.full(ga.omega.shape, np.inf)
    for i in range(ga.d.n):
        for j in range(len(ga.allowed[i])):
            mm[i, j] = e[xs[:, i] == j].min()
    return e.min(), mm


@pytest.mark.parametrize("kind", ["chain", "dag"])
def test_dp_minimum_argmin_and_min_marginals_are_exact(kind):
    rng = np.random.default_rng(0)
    checked = 0
    for seed in range(12):
        inst = synthetic(7, 3, 1, kind, seed=seed) if seed % 2 else random_small(seed, n_ops=7, n_groups=1)
        ga = group_arrays(inst, inst.groups[0])
        if ga is None:
            continue
        lam = rng.uniform(0, 0.01, size=(3, 2)) * np.array(ga.active)
        e = _Evaluator(ga).energy(lam)
        msgs, low, picks = e.forward()
        x = e.argmin(picks)
        mms = e.min_marginals(msgs)
        part = _Evaluator(ga).parts(x)
        for k in range(len(lam)):
            best, mm = energy_brute(ga, lam[k])
            at_x = part[k, 0] + lam[k, 0] * part[k, 1] + lam[k, 1] * part[k, 2]
            assert low[k] == pytest.approx(best, rel=1e-9, abs=1e-12)
            assert at_x == pytest.approx(best, rel=1e-9, abs=1e-12)  # the decoded plan attains it
            finite = np.isfinite(mm)
            assert np.allclose(mms[k][finite], mm[finite], rtol=1e-9, atol=1e-12)
        checked += 1
    assert checked >= 8


def test_bound_plan_and_fixing_against_brute_force():
    cases = one_group_cases()
    assert len(cases) >= 30
    bad, fixed_some = [], 0
    for seed, inst in cases:
        g = inst.groups[0]
        ga = group_arrays(inst, g)
        br = brute_force(inst)
        if ga is None:
            continue
        lag = solve_dual(ga, time.perf_counter() + 10, target_gap=0.0)
        if br.status == "infeasible":
            if lag.plan is not None:
                bad.append(f"seed {seed}: a plan for an infeasible instance")
            continue
        if lag.bound > br.objective * (1 + 1e-9) + 1e-15:
            bad.append(f"seed {seed}: bound {lag.bound:.9g} > optimum {br.objective:.9g}")
        if lag.plan is None:
            continue
        ev = evaluate(inst, {g.name: lag.plan})
        if ev.violations or not rel_close(ev.objective(inst), lag.objective, 1e-9, 1e-15):
            bad.append(f"seed {seed}: plan {ev.violations} or objective {lag.objective} vs {ev.objective(inst)}")
        reduced = replace(inst, groups=(replace(g, allowed=lag.keep),))
        fixed_some += sum(map(len, g.allowed.values())) > sum(map(len, lag.keep.values()))
        red = brute_force(reduced)
        if red.status != "optimal" or not rel_close(red.objective, br.objective, 1e-9, 1e-15):
            bad.append(f"seed {seed}: fixing lost the optimum: {red.objective} vs {br.objective}")
        if lag.fixed_floor < br.objective * (1 - 1e-9) - 1e-15:  # removed only above the incumbent
            bad.append(f"seed {seed}: a removed choice's min-marginal {lag.fixed_floor} is below the optimum")
    assert not bad, "\n".join(bad)
    assert fixed_some >= 10  # the test means something: fixing does remove choices


@pytest.mark.parametrize("backend", exact_params())
def test_solves_with_the_lagrangian_match_brute_force(backend, small_cases):
    cases = [(s, i, b) for s, i, b in small_cases if i.objective == "accuracy_degradation" and i.max_degradation is None]
    cases += [(s, i, brute_force(i)) for s, i in one_group_cases(30)]
    bad = optimum_and_bound_mismatches(backend, cases, time_limit_s=120)
    assert len(cases) >= 40
    assert not bad, "\n".join(bad)


def test_a_wide_cast_graph_is_left_to_the_mip():
    inst = random_small(3, n_ops=8, n_groups=1, objective="accuracy_degradation")
    g = inst.groups[0]
    ops = list(g.allowed)
    dense = {(a, b): {(pa, pb): 0.1 for pa in g.allowed[a] for pb in g.allowed[b] if pa != pb}
             for i, a in enumerate(ops) for b in ops[i + 1:]}
    wide = replace(inst, groups=(replace(g, cast_ms=dense, time_bound_ms=None, mem_capacity_bytes=math.inf),))
    assert group_arrays(wide, wide.groups[0]) is None  # every op open at once: 3**8 > MAX_TABLE
    r = solve_instance(wide, rel_gap=0.0, tie_break=False)
    assert r.status == "optimal" and "Lagrangian" not in r.message
