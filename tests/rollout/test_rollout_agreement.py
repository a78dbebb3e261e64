"""Ranking agreement between the simulator and the real run's interleaved rounds (rollout.agreement)."""

from __future__ import annotations

import itertools
import math

import pytest

from qsync_opt.rollout.agreement import discordant, kendall_tau_b, pair_wins, round_normalised


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
