"""Ranking agreement between the simulator and the real run's interleaved rounds (rollout.agreement)."""

from __future__ import annotations

import itertools
import math

import pytest

from qsync_opt.rollout.agreement import _sign_cover, discordant, kendall_tau_b, ordered_pairs, pair_wins, ratio_interval, round_normalised


def test_round_normalisation_removes_a_load_drift_shared_by_the_round():
    # b is 10% faster than a in every round, while the machine's load halves throughput in round 2
    rounds = {"a": [100.0, 50.0, 100.0], "b": [110.0, 55.0, 110.0]}
    norm = round_normalised(rounds)
    assert norm["b"] / norm["a"] == pytest.approx(1.1)
    assert pair_wins(rounds, "b", "a") == 3 and pair_wins(rounds, "a", "b") == 0


def test_discordant_pairs_and_ties():
    rounds = {"x": [10.0, 12.0, 11.0], "y": [12.0, 13.0, 12.5], "z": [12.1, 12.9, 12.4]}
    # the simulator puts x above y (wrong: y wins every round) and y, z exactly alike (a tie: no constraint)
    pred = {"x": 20.0, "y": 15.0, "z": 15.0}
    d = discordant(pred, rounds)
    assert [(e.higher_predicted, e.lower_predicted) for e in d] == [("x", "y"), ("x", "z")]
    assert d[0].wins == 0 and d[0].rounds == 3 and d[0].real_ratio < 1 < d[0].predicted_ratio
    assert discordant({"x": 1.0, "y": 2.0, "z": 2.0}, rounds) == []


def _tau_brute(x, y):
    """tau-b from its definition over every pair: (n_c - n_d) / sqrt((n0 - n1)(n0 - n2))."""
    pairs = list(itertools.combinations(sorted(x), 2))
    s = [(math.copysign(1, x[a] - x[b]) if x[a] != x[b] else 0, math.copysign(1, y[a] - y[b]) if y[a] != y[b] else 0)
         for a, b in pairs]
    n0 = len(pairs)
    n1 = sum(1 for sx, _ in s if sx == 0)
    n2 = sum(1 for _, sy in s if sy == 0)
    num = sum(sx * sy for sx, sy in s)
    return num / math.sqrt((n0 - n1) * (n0 - n2))


@pytest.mark.parametrize("seed", range(20))
def test_kendall_tau_b_matches_its_definition(seed):
    import random

    rng = random.Random(seed)
    names = [f"v{i}" for i in range(rng.randint(3, 7))]
    x = {n: float(rng.randint(0, 3)) for n in names}
    y = {n: float(rng.randint(0, 3)) for n in names}
    if len(set(x.values())) == 1 or len(set(y.values())) == 1:
        return
    assert kendall_tau_b(x, y) == pytest.approx(_tau_brute(x, y))
    assert kendall_tau_b(x, x) == pytest.approx(1.0)


def test_unequal_rounds_are_refused():
    with pytest.raises(ValueError, match="same number of rounds"):
        round_normalised({"a": [1.0, 2.0], "b": [1.0]})


@pytest.mark.parametrize("n", range(1, 13))
def test_sign_interval_coverage_by_enumeration(n):
    """x(k) <= median <= x(n + 1 - k) holds when k to n - k of the n draws fall below the median: counted over all
    2^n equally likely patterns of draws below / above it."""
    for k in range(1, (n + 1) // 2 + 1):
        hits = sum(k <= bin(p).count("1") <= n - k for p in range(2 ** n))
        assert _sign_cover(n, k) == pytest.approx(hits / 2 ** n)


def test_ratio_interval_picks_the_textbook_order_statistics():
    # n = 20 at 95%: x(6) .. x(15) (coverage 0.9586); n = 7: the whole range (0.984); n = 5 cannot reach 95%
    rounds = {"a": [float(i + 1) for i in range(20)], "b": [1.0] * 20}
    assert ratio_interval(rounds, "a", "b") == pytest.approx((6.0, 15.0, 0.958610534667968))
    lo, hi, conf = ratio_interval({"a": [3.0, 1.0, 2.0, 7.0, 5.0, 4.0, 6.0], "b": [1.0] * 7}, "a", "b")
    assert (lo, hi) == (1.0, 7.0) and conf == pytest.approx(1 - 2 / 2 ** 7)
    assert ratio_interval({"a": [1.0] * 5, "b": [2.0] * 5}, "a", "b")[2] == pytest.approx(1 - 2 / 2 ** 5)


def test_discordant_pair_resolved_only_when_the_real_run_orders_it():
    # the simulator puts p above q; q wins all 7 rounds (resolved: a wrong prediction), while r and p trade
    # places (p ahead in 3 of 7: discordant by the medians, yet within the run's noise)
    q = [100.0, 90.0, 110.0, 95.0, 105.0, 100.0, 98.0]
    p = [x * f for x, f in zip(q, (0.9, 0.95, 0.92, 0.97, 0.9, 0.94, 0.96))]
    r = [x * f for x, f in zip(p, (1.03, 0.98, 1.02, 0.97, 1.04, 0.99, 1.01))]
    d = {(e.higher_predicted, e.lower_predicted): e for e in discordant({"p": 3.0, "q": 2.0, "r": 1.0},
                                                                       {"p": p, "q": q, "r": r})}
    assert d[("p", "q")].resolved and d[("p", "q")].interval[1] < 1 and d[("p", "q")].confidence > 0.95
    assert not d[("p", "r")].resolved and d[("p", "r")].wins == 3


def test_ordered_pairs_counts_only_what_the_real_run_separates():
    # a beats b and c in all 7 rounds; b and c trade places. The prediction a > c > b gets both ordered pairs
    # right whatever it says of b, c; a prediction tying a with b gets one of the two
    a = [200.0, 180.0, 210.0, 190.0, 205.0, 199.0, 195.0]
    b = [100.0, 90.0, 110.0, 95.0, 105.0, 100.0, 98.0]
    c = [x * f for x, f in zip(b, (1.03, 0.98, 1.02, 0.97, 1.04, 0.99, 1.01))]
    rounds = {"a": a, "b": b, "c": c}
    assert ordered_pairs({"a": 3.0, "b": 1.0, "c": 2.0}, rounds) == (2, 2)
    assert ordered_pairs({"a": 3.0, "b": 3.0, "c": 2.0}, rounds) == (2, 1)
    assert ordered_pairs({"a": 1.0, "b": 2.0, "c": 3.0}, rounds) == (2, 0)
