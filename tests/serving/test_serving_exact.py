"""Every exact backend finds the brute-force optimum of small serving programs, in both forms."""

from __future__ import annotations

from dataclasses import replace

import pytest
from serving_cases import random_instance

from qsync_opt.solver.backends import EXACT, available
from qsync_opt.solver.backends.base import SolveOptions
from qsync_opt.serving.program import compile_serving, evaluate, solve_serving
from qsync_opt.serving.bounds import brute_force, lower_bound

BACKENDS = [pytest.param(b, marks=pytest.mark.skipif(not available()[b], reason=f"{b} not available")) for b in EXACT]
EXACT_OPTS = SolveOptions(time_limit_s=60, rel_gap=1e-7, threads=1)
"""rel_gap 1e-7, not 0: CP-SAT works on an integer-scaled copy (units of 2**-24 of a row's largest
coefficient); objectives are compared to 1e-6. threads=1: with more, CP-SAT's interleaved search
(backends/cpsat.py) runs to the time limit after proving optimality."""


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-6 * max(1.0, abs(b))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("seed", range(6), ids=lambda s: f"seed{s}")
def test_per_layer_program_matches_brute_force(backend, seed):
    inst = random_instance(seed, layers=4 + seed % 3, stages=3, identical=False)
    best, best_obj = brute_force(inst)
    res = solve_serving(inst, backend, EXACT_OPTS)
    if best is None:
        assert res.status == "infeasible"
        return
    assert res.status == "optimal"
    assert _close(res.objective, best_obj), (res.objective, best_obj)
    assert not evaluate(inst, res.assignment).violations


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("seed", range(6), ids=lambda s: f"seed{s}")
def test_aggregated_program_has_the_per_layer_optimum(backend, seed):
    """Identical layers: counts per (stage, bit) lose nothing against one binary per layer."""
    inst = random_instance(100 + seed, layers=6, stages=3, identical=True)
    assert compile_serving(inst).meta["form"] == "aggregated"
    best, best_obj = brute_force(inst)
    agg = solve_serving(inst, backend, EXACT_OPTS, aggregate=True)
    per_layer = solve_serving(inst, backend, EXACT_OPTS, aggregate=False)
    if best is None:
        assert agg.status == per_layer.status == "infeasible"
        return
    assert agg.status == per_layer.status == "optimal"
    assert _close(agg.objective, best_obj) and _close(per_layer.objective, best_obj)
    assert compile_serving(inst, aggregate=True).stats()["variables"] < compile_serving(inst, aggregate=False).stats()["variables"]


@pytest.mark.parametrize("seed", range(12), ids=lambda s: f"seed{s}")
def test_lower_bound_never_exceeds_the_optimum(seed):
    inst = random_instance(200 + seed, layers=5, stages=3, identical=seed % 2 == 0)
    best, best_obj = brute_force(inst)
    if best is not None:
        assert lower_bound(inst) <= best_obj * (1 + 1e-9)


@pytest.mark.parametrize("seed", range(8), ids=lambda s: f"seed{s}")
def test_hard_quality_bound_holds(seed):
    """A bound half-way between the least Σω that fits and the unbounded optimum's Σω: it binds, and the
    solver must give the bounded program's brute-force optimum within it."""
    free = replace(random_instance(300 + seed, layers=6, stages=3), max_indicator=None)
    a_free, _ = brute_force(free)
    assert a_free is not None
    q_free = evaluate(free, a_free).quality
    _, q_min = brute_force(replace(free, quality_only=True))
    assert q_min < q_free  # these seeds leave room for a bound that binds
    inst = replace(free, max_indicator=(q_min + q_free) / 2)
    _, best_obj = brute_force(inst)
    res = solve_serving(inst, "highs", EXACT_OPTS)
    assert res.status == "optimal"
    assert res.evaluation.quality <= inst.max_indicator * (1 + 1e-9)
    assert _close(res.objective, best_obj), (res.objective, best_obj)
