"""The balancer at scale: the lower bounds are valid (never above a brute-force optimum), the heap
LPT gives today's plans and the whole heuristic is no worse than today's, the exact stage is
skipped where the bound already proves the heuristic, and the call's time limit covers model
building (a fake clock: nothing here depends on timing)."""

import itertools
import random

import pytest

from qsync_opt.loading import balance as B
from qsync_opt.loading import balance_exact as BE
from qsync_opt.loading.cost import CostModel
from tests.loading import balance_reference as REF


def brute(inst):
    best = None
    for owner in itertools.product(range(inst.k), repeat=inst.n):
        if B.feasible(inst, owner):
            m = max(B.loads_of(inst, owner))
            best = m if best is None or m < best else best
    return best


def case(seed, n=7, k=3, per_rank=False):
    rng = random.Random(seed)
    lengths = [rng.choice([rng.randint(8, 64), rng.randint(200, 900), 700]) for _ in range(n)]
    speeds = [rng.choice([1.0, 0.5, 0.75, 0.3, 1.0]) for _ in range(k)]
    cost = CostModel(a=100.0, b=0.3)
    cap = rng.choice([None, None, int(sum(lengths) / k * 1.4) + 900])
    eq = rng.random() < 0.3
    costs = cost.costs(lengths)
    matrix = None
    if per_rank:
        other = CostModel(a=80.0, b=0.6, c0=2000.0)
        matrix = [[(cost if r % 2 == 0 else other)(L) / speeds[r] for r in range(k)] for L in lengths]
    return (costs, speeds, lengths, cap, eq, matrix)


def make(args):
    costs, speeds, lengths, cap, eq, matrix = args
    return B.make_instance(costs, speeds, lengths, cap, equal_counts=eq, rank_costs=matrix)


@pytest.mark.parametrize("seed", range(40))
def test_lower_bounds_never_exceed_the_optimum(seed):
    inst = make(case(seed, n=random.Random(seed).randint(3, 7), k=random.Random(seed + 1).randint(2, 3),
                     per_rank=seed % 4 == 3))
    opt = brute(inst)
    if opt is None:
        return
    assert B.counting_bound(inst) <= opt
    assert B.area_bound(inst) <= opt and B.single_bound(inst) <= opt and B.large_area_bound(inst) <= opt
    assert B.lower_bound(inst) <= opt


def _counting_by_definition(inst):
    """max_j of the least T with Σ_r floor(T / q_r(j)) ≥ j, scanning the candidates m·q_r(j)."""
    order = sorted(range(inst.n), key=lambda i: (-max(inst.weights[i]), i))
    best = 0
    for j in range(1, inst.n + 1):
        q = [min(inst.weights[i][r] for i in order[:j]) for r in range(inst.k)]
        if min(q) == 0:
            continue
        cands = sorted({m * qr for qr in q for m in range(1, j + 1)})
        best = max(best, next(T for T in cands if sum(T // qr for qr in q) >= j))
    return best


@pytest.mark.parametrize("seed", range(12))
def test_counting_bound_matches_its_definition(seed):
    rng = random.Random(seed)
    n, k = rng.randint(1, 30), rng.randint(1, 6)
    costs = [rng.choice([rng.uniform(1, 50), rng.uniform(100, 900)]) for _ in range(n)]
    speeds = [rng.choice([1.0, 0.6, 0.3]) for _ in range(k)]
    inst = B.make_instance(costs, speeds)
    assert B.counting_bound(inst) == _counting_by_definition(inst)


def test_counting_bound_proves_k_plus_one_equal_samples():
    """K+1 equal samples on K equal ranks: two share a rank, so 2w is optimal; the area bound only
    gives (1 + 1/K)·w and the largest sample w."""
    inst = B.make_instance([5.0] * 9, [1.0] * 8)
    w = inst.weights[0][0]
    assert B.area_bound(inst) < 2 * w and B.single_bound(inst) == w
    assert B.counting_bound(inst) == 2 * w
    small = B.make_instance([5.0] * 5, [1.0] * 4)
    assert B.counting_bound(small) == brute(small) == 2 * small.weights[0][0]


@pytest.mark.parametrize("seed", range(30))
def test_fast_heuristics_give_todays_plans_or_better(seed):
    """Same integer weights, the heap LPT and KK assign exactly as today's, and the whole heuristic
    is no worse than today's beyond the local search's stopping gap (it stops once the bound proves
    it within LS_GAP of the optimum)."""
    rng = random.Random(seed)
    args = case(seed, n=rng.randint(1, 60), k=rng.randint(1, 8))
    inst, ref = make(args), REF.make_instance(*args[:5])
    assert inst.weights == ref.weights
    assert B.lpt(inst) == REF.lpt(ref)
    assert B.karmarkar_karp(inst) == REF.karmarkar_karp(ref)
    try:
        old = REF.reference_balance(ref)
    except ValueError:  # today's raises when neither heuristic fits the caps
        return
    new = B.balance(inst, backend=None)
    assert B.feasible(inst, new.owner())
    assert new.makespan <= old.makespan * (1 + B.LS_GAP)
    assert new.bound >= old.bound


def test_fast_heuristic_no_worse_than_today_on_a_larger_batch():
    rng = random.Random(7)
    lengths = [min(16384, max(1, int(rng.lognormvariate(6.9, 1.0)))) for _ in range(600)]
    costs = CostModel(a=3.9e10, b=7.9e5).costs(lengths)
    speeds = [1.0] * 12 + [0.6] * 12 + [0.3] * 12
    new = B.balance(B.make_instance(costs, speeds, lengths), backend=None)
    old = REF.reference_balance(REF.make_instance(costs, speeds, lengths))
    assert new.makespan <= old.makespan * 1.001


def _no_exact(*a, **kw):
    raise AssertionError("the exact stage ran")


def test_exact_stage_skipped_where_the_bound_proves_the_heuristic(monkeypatch):
    """Nine equal samples over eight ranks: the heuristic's 2w is optimal and the counting bound
    proves it, so even at gap 0 the exact program is never built."""
    monkeypatch.setattr(B, "solve_exact", _no_exact)
    monkeypatch.setattr(BE, "build_problem", _no_exact)
    r = B.balance(B.make_instance([5.0] * 9, [1.0] * 8), backend="highs", gap_tol=0.0, time_limit_s=10)
    assert r.status == "optimal" and r.makespan == r.bound
    assert "exact_status" not in r.detail


def test_exact_stage_skipped_within_gap_tol(monkeypatch):
    inst = make(case(3, n=40, k=4))
    heur = B.balance(inst, backend=None)
    assert heur.makespan > heur.bound
    monkeypatch.setattr(B, "solve_exact", _no_exact)
    r = B.balance(inst, backend="highs", gap_tol=heur.gap, time_limit_s=10)
    assert r.ranks == heur.ranks and "exact_status" not in r.detail


class FakeClock:
    """A clock that moves only when told to (and by `tick` per reading)."""

    def __init__(self, tick=0.0):
        self.t, self.tick = 100.0, tick

    def __call__(self):
        self.t += self.tick
        return self.t


def _gap_case():
    inst = make(case(21, n=48, k=4))
    heur = B.balance(inst, backend=None)
    assert heur.makespan > heur.bound  # so the exact stage would run at gap 0
    return inst, heur


def test_a_model_too_large_for_the_limit_is_never_built(monkeypatch):
    """balance()'s own defaults (0.05 s) on 1,024 samples over 64 ranks: its model would take longer
    to build than the whole limit, so it is not started, and the heuristic stands."""
    rng = random.Random(1)
    lengths = [rng.randint(20, 4000) for _ in range(1024)]
    inst = B.make_instance(CostModel(a=1.0, b=1e-3).costs(lengths), [1.0] * 32 + [0.5] * 32, lengths)
    assert B.exact_build_estimate_s(inst) > 0.05
    monkeypatch.setattr(BE, "build_problem", _no_exact)
    monkeypatch.setattr(B, "_clock", FakeClock())
    r = B.balance(inst)
    if r.makespan > r.bound:
        assert "model too large" in r.detail["exact_skipped"]
    assert "exact_status" not in r.detail and B.feasible(inst, r.owner())


def test_no_exact_stage_when_the_heuristics_spent_the_limit(monkeypatch):
    inst, heur = _gap_case()
    clock = FakeClock()
    monkeypatch.setattr(B, "_clock", clock)
    real_lpt = B.lpt

    def slow_lpt(i):
        clock.t += 0.999  # the heuristics leave 1 ms of the 1 s limit, less than the model needs
        return real_lpt(i)

    monkeypatch.setattr(B, "lpt", slow_lpt)
    monkeypatch.setattr(B, "solve_exact", _no_exact)
    r = B.balance(inst, backend="highs", time_limit_s=1.0)
    assert r.detail["exact_skipped"].startswith("time limit spent") and r.detail["time_limited"]
    assert r.ranks == heur.ranks


def test_the_solver_gets_what_is_left_of_the_limit(monkeypatch):
    """The limit bounds the whole call: the solver's deadline is the call's start plus the limit
    (less the stop margin), and its own time limit what is left of it after the heuristics."""
    inst, heur = _gap_case()
    clock = FakeClock(tick=0.001)  # every reading of the clock moves it 1 ms
    monkeypatch.setattr(B, "_clock", clock)
    seen = {}

    def fake_solve(i, backend, time_limit_s, start, work_limit=None, lower=None, deadline=None, clock=None):
        seen.update(limit=time_limit_s, deadline=deadline, now=clock.t)
        return None, "unknown", lower, None

    start = clock.t
    monkeypatch.setattr(B, "solve_exact", fake_solve)
    r = B.balance(inst, backend="highs", time_limit_s=0.5)
    assert seen["deadline"] <= start + 0.001 + 0.5 * (1 - B.STOP_MARGIN) + 1e-9
    assert seen["limit"] <= seen["deadline"] - seen["now"] + 1e-9
    assert r.ranks == heur.ranks and r.detail["time_limited"]


def test_solve_exact_stops_when_building_used_the_time(monkeypatch):
    inst, _ = _gap_case()
    clock = FakeClock()
    real_build = BE.build_problem

    def slow_build(*a, **kw):
        clock.t += 5.0
        return real_build(*a, **kw)

    monkeypatch.setattr(BE, "build_problem", slow_build)
    owner, status, bound, raw = BE.solve_exact(inst, "highs", 1.0, deadline=clock.t + 1.0, clock=clock)
    assert owner is None and status == "time_limit" and raw is None


@pytest.mark.parametrize("seed", range(10))
def test_multifit_plans_fit_their_capacity(seed):
    rng = random.Random(seed)
    args = case(seed, n=rng.randint(5, 80), k=rng.randint(2, 9))
    inst = B.make_instance(args[0], args[1], args[2])  # no caps or count rule
    lb = B.lower_bound(inst)
    for T in (lb, int(lb * 1.05), int(lb * 1.3)):
        own = B.fit_within(inst, T)
        assert own is None or max(B.loads_of(inst, own)) <= T
    upper = max(B.loads_of(inst, B.lpt(inst)))
    mf = B.multifit(inst, lb, upper)
    assert mf is None or max(B.loads_of(inst, mf)) < upper


def test_multifit_packs_long_samples_that_lpt_pairs():
    """Five long samples and many short ones over four ranks: LPT (and today's balancer, and the
    local search from it) end 1.1% above the bound; MULTIFIT packs the two smallest long ones
    together and ends 0.4% above. balance() tries it when the search stays 0.1% above."""
    lengths = [900, 880, 860, 500, 480] + [30] * 60
    costs = [float(x) for x in lengths]
    inst = B.make_instance(costs, [1.0] * 4)
    r = B.balance(inst, backend=None)
    old = REF.reference_balance(REF.make_instance(costs, [1.0] * 4))
    assert r.method == "multifit+ls" and r.makespan < old.makespan * (1 - 5e-3)


def test_multifit_and_the_wide_search_stop_at_the_time_limit(monkeypatch):
    """The optional stages ask the clock before every probe and step: with the limit spent by the
    time they would start, the fast heuristic's plan stands and the result says time_limited."""
    lengths = [900, 880, 860, 500, 480] + [30] * 60
    inst = B.make_instance([float(x) for x in lengths], [1.0] * 4)
    free = B.balance(inst, backend=None)
    assert free.method == "multifit+ls" and not free.detail.get("time_limited")
    clock = FakeClock()
    monkeypatch.setattr(B, "_clock", clock)
    real_lpt = B.lpt

    def slow_lpt(i):
        clock.t += 2.0  # past the 1 s limit
        return real_lpt(i)

    monkeypatch.setattr(B, "lpt", slow_lpt)
    r = B.balance(inst, backend=None, time_limit_s=1.0)
    assert r.detail["time_limited"] and r.method in ("lpt+ls", "kk+ls") and r.makespan > free.makespan
