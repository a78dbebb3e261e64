"""Loader sizing: the program's worker counts match brute force on small budgets."""

import itertools

import pytest

from qsync_opt.errors import InfeasibleError
from qsync_opt.loading.sizing import peak_shares, size_loaders


def brute(cost, shares, rate, cpus, mem=None, memory=None, hi=None):
    need = [c * s * rate for c, s in zip(cost, shares)]
    k = len(cost)
    best = None
    for n in itertools.product(*(range(1, (hi[i] if hi else cpus) + 1) for i in range(k))):
        if sum(n) > cpus or (memory is not None and sum(a * b for a, b in zip(n, mem)) > memory):
            continue
        z = min(n[i] / need[i] for i in range(k))
        key = (-min(z, 1.0), sum(n))
        best = key if best is None or key < best else best
    return best


@pytest.mark.parametrize("case", [
    dict(cost=[0.002, 0.02, 0.005], shares=[0.6, 0.3, 0.1], rate=400.0, cpus=8),
    dict(cost=[0.002, 0.02, 0.005], shares=[0.6, 0.3, 0.1], rate=100.0, cpus=8),
    dict(cost=[0.01, 0.03], shares=[0.5, 0.5], rate=200.0, cpus=9, mem=[1.0, 3.0], memory=15.0),
    dict(cost=[0.01, 0.03, 0.001], shares=[0.2, 0.7, 0.1], rate=150.0, cpus=7, hi=[3, 4, 2]),
])
def test_matches_brute_force(case):
    s = size_loaders(["a", "b", "c"][:len(case["cost"])], case["cost"], case["shares"], case["rate"], case["cpus"],
                     mem_per_worker=case.get("mem"), memory=case.get("memory"), max_workers=case.get("hi"))
    ref = brute(case["cost"], case["shares"], case["rate"], case["cpus"], case.get("mem"), case.get("memory"), case.get("hi"))
    assert (-min(s.supply_ratio, 1.0), sum(s.workers.values())) == pytest.approx(ref)
    assert s.status == "optimal"


def test_peak_share_follows_schedule():
    assert peak_shares([[(0, 1.0), (100, 1.0)], [(0, 0.0), (100, 3.0)]]) == pytest.approx([1.0, 0.75])


def test_budget_below_one_worker_per_source():
    with pytest.raises(InfeasibleError, match="CPU budget"):
        size_loaders(["a", "b"], [0.1, 0.1], [0.5, 0.5], 10.0, 1)
