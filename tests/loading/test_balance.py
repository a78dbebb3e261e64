"""The balancer: the exact program's optimum equals brute force on small batches, every exact
backend agrees on it, the same inputs give the same assignment, and a hit time limit falls
back to the (deterministic) heuristic with an honest status and bound."""

import itertools
import random

import pytest

from qsync_opt.errors import InfeasibleError, SpecError
from qsync_opt.loading import balance as B
from qsync_opt.loading.cost import CostModel
from qsync_opt.solver.backends import EXACT, available


def brute(inst):
    best = None
    for owner in itertools.product(range(inst.k), repeat=inst.n):
        if B.feasible(inst, owner):
            m = max(B.loads_of(inst, owner))
            best = m if best is None else min(best, m)
    return best


def random_case(seed, n=7, k=3):
    rng = random.Random(seed)
    lengths = [rng.choice([rng.randint(8, 64), rng.randint(200, 900)]) for _ in range(n)]
    speeds = [rng.choice([1.0, 0.5, 0.75, 0.3]) for _ in range(k)]
    cost = CostModel(a=100.0, b=0.3)
    cap = rng.choice([None, int(sum(lengths) / k * 1.4)])
    return B.make_instance(cost.costs(lengths), speeds, lengths, cap, equal_counts=rng.random() < 0.4)


EXACT_HERE = [b for b in EXACT if available()[b]]


@pytest.mark.parametrize("seed", range(10))
def test_exact_matches_brute_force(seed):
    inst = random_case(seed)
    ref = brute(inst)
    if ref is None:
        with pytest.raises(InfeasibleError):
            B.balance(inst, backend="highs", time_limit_s=10)
        return
    r = B.balance(inst, backend="highs", time_limit_s=10)
    assert r.status == "optimal"
    assert r.makespan == ref
    assert B.feasible(inst, r.owner())
    assert r.bound <= ref


@pytest.mark.parametrize("backend", EXACT_HERE)
def test_every_backend_agrees(backend):
    for seed in (1, 4, 7):
        inst = random_case(seed, n=6, k=3)
        ref = brute(inst)
        if ref is None:
            continue
        owner, status, bound, _ = B.solve_exact(inst, backend, time_limit_s=20)
        assert status == "optimal", (backend, seed, status)
        assert max(B.loads_of(inst, owner)) == ref
        assert bound <= ref


def test_speed_aware_beats_speed_blind():
    """Two ranks, one at half speed: KK that ignores speeds halves the work and waits for the
    slow rank; the speed-aware plan gives it about a third."""
    rng = random.Random(3)
    lengths = [rng.randint(50, 500) for _ in range(32)]
    cost = CostModel(a=1.0, b=0.01)
    inst = B.make_instance(cost.costs(lengths), [1.0, 0.5], lengths)
    blind = B.kk_parts(cost.costs(lengths), 2)
    ours = B.balance(inst, backend="highs", time_limit_s=0.5)
    assert ours.makespan < 0.8 * max(B.loads_of(inst, blind))
    assert ours.gap < 1e-3  # measured against a proven lower bound


def test_deterministic():
    inst = random_case(11, n=40, k=4)
    a = B.balance(inst, backend="highs", time_limit_s=0.5)
    b = B.balance(inst, backend="highs", time_limit_s=0.5)
    assert a.ranks == b.ranks and a.method == b.method
    assert B.karmarkar_karp(inst) == B.karmarkar_karp(inst)
    assert B.lpt(inst) == B.lpt(inst)


def test_time_limit_falls_back_to_heuristic():
    rng = random.Random(5)
    lengths = [rng.randint(20, 2000) for _ in range(256)]
    speeds = [1.0, 0.9, 0.8, 0.7, 0.6, 0.55, 0.5, 0.45]
    inst = B.make_instance(CostModel(a=50.0, b=0.1).costs(lengths), speeds, lengths)
    heur = B.balance(inst, backend=None)
    r = B.balance(inst, backend="highs", time_limit_s=0.001)
    assert r.status in ("optimal", "feasible")
    if r.status == "feasible":
        assert r.method in ("kk+ls", "lpt+ls") and r.ranks == heur.ranks
    assert r.bound <= r.makespan
    assert B.feasible(inst, r.owner())


def test_equal_counts_and_cap_are_kept():
    lengths = [900, 850, 30, 20, 25, 40, 35, 800]
    inst = B.make_instance(CostModel(a=1.0, b=0.01).costs(lengths), [1.0, 0.4], lengths,
                           token_cap=1800, equal_counts=True)
    r = B.balance(inst, backend="highs", time_limit_s=10)
    assert [len(x) for x in r.ranks] == [4, 4]
    assert all(sum(lengths[i] for i in rk) <= 1800 for rk in r.ranks)
    assert r.makespan == brute(inst)


def test_infeasible_cap_is_an_error_naming_the_fix():
    lengths = [1000, 1000, 1000]
    inst = B.make_instance([1.0] * 3, [1.0, 1.0], lengths, token_cap=1000)
    with pytest.raises(InfeasibleError, match="token_cap"):
        B.balance(inst, backend="highs", time_limit_s=5)


def test_bad_speed_is_a_spec_error():
    with pytest.raises(SpecError, match="speed"):
        B.make_instance([1.0], [1.0, 0.0])


def test_per_rank_cost_curves_match_brute_force():
    """One c(L) per rank (a fast rank whose attention is cheap beside one whose per-sample
    overhead is): the program optimises the real per-rank sums."""
    lengths = [40, 900, 120, 60, 700, 30, 300]
    fast_attn = CostModel(a=1.0, b=0.0005, c0=80.0)
    slow_attn = CostModel(a=1.0, b=0.004, c0=5.0)
    matrix = list(zip(fast_attn.costs(lengths), slow_attn.costs(lengths)))
    inst = B.make_instance(None, [1.0, 0.5], lengths, rank_costs=matrix)
    r = B.balance(inst, backend="highs", time_limit_s=10)
    assert r.status == "optimal" and r.makespan == brute(inst)
    assert r.bound <= r.makespan


def test_work_limit_makes_a_stopped_exact_stage_reproducible():
    """CP-SAT on one thread under a deterministic budget: the same split twice, even when
    the budget (not a proof) stops it, and its incumbent is never worse than the heuristic."""
    inst = random_case(21, n=48, k=4)
    runs = [B.balance(inst, backend="cpsat", time_limit_s=60, work_limit=0.002) for _ in range(2)]
    assert runs[0].detail["exact_status"] == "feasible"  # stopped by the budget, not by a proof
    assert runs[0].ranks == runs[1].ranks and runs[0].method == runs[1].method
    assert not runs[0].detail.get("time_limited")
    assert runs[0].makespan <= B.balance(inst, backend=None).makespan


def test_min_gain_skips_an_exact_stage_that_cannot_pay_for_itself():
    """The exact stage runs only when the heuristic's slowest load exceeds the lower bound by
    more than `min_gain` (cost units): the most it could win. The choice depends on the
    instance alone."""
    inst = random_case(21, n=48, k=4)
    heur = B.balance(inst, backend=None)
    room = (heur.makespan - heur.bound) * inst.scale  # cost units the exact stage could win at most
    assert room > 0
    ran = B.balance(inst, backend="cpsat", time_limit_s=60, work_limit=0.002, min_gain=0.99 * room)
    assert "exact_status" in ran.detail and "exact_skipped" not in ran.detail
    skipped = B.balance(inst, backend="cpsat", time_limit_s=60, work_limit=0.002, min_gain=room)
    assert "exact_status" not in skipped.detail and skipped.detail["exact_skipped"]
    assert skipped.ranks == heur.ranks and skipped.method == heur.method


def test_plane_applies_min_gain_only_to_costs_in_seconds():
    from qsync_opt.loading.plane import DataPlane, SourceIndex

    import numpy as np

    src = [SourceIndex("s", np.array([30, 900, 120, 60, 700, 40, 300, 500] * 4))]
    lengths = [30, 900, 120, 60, 700, 40, 300, 500, 800, 25, 640, 90]
    sec = CostModel(a=4e-5, b=3e-8, c0=2e-3, unit="s")
    big = DataPlane(src, global_batch=12, speeds=[1.0, 0.7, 0.4], cost=sec, gap_tol=0.0, min_gain_s=1.0)
    assert big.assign(lengths).detail.get("exact_skipped")
    flops = CostModel(a=4e4, b=30.0)  # FLOPs: min_gain_s (seconds) does not apply
    assert not DataPlane(src, global_batch=12, speeds=[1.0, 0.7, 0.4], cost=flops, gap_tol=0.0, min_gain_s=1.0) \
        .assign(lengths).detail.get("exact_skipped")
