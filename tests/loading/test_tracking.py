"""CostTracker: a rank that slows down mid-run is followed; one fit over all its history is not.

Synthetic and deterministic: the true curve, the lengths and a ±5% multiplicative noise come
from a seeded generator; no timing is measured."""

import numpy as np
import pytest

from qsync_opt.errors import SpecError
from qsync_opt.loading.cost import CostModel, fit
from qsync_opt.loading.tracking import CostTracker

TRUE = CostModel(a=4e-5, b=3e-8, c0=2e-3, unit="s")
CALIB = (32, 128, 384, 768, 1280)
SLOW_AT, SLOW, ROUNDS, HALF_LIFE = 20, 1.3, 40, 4.0


def run(slow_at=SLOW_AT, slow=SLOW):
    rng = np.random.default_rng(21)
    tracker = CostTracker([[(L, TRUE(L)) for L in CALIB], [(L, TRUE(L)) for L in CALIB]], half_life=HALF_LIFE)
    every = [[(L, TRUE(L)) for L in CALIB] for _ in range(2)]
    history = []
    for k in range(ROUNDS):
        rounds = []
        for r in range(2):
            lengths = np.clip(rng.lognormal(np.log(200), 0.8, 8), 16, 1536).astype(int)
            f = slow if (r == 0 and k >= slow_at) else 1.0  # rank 0 slows down, rank 1 does not
            rounds.append([(int(L), f * TRUE(L) * (1 + rng.uniform(-0.05, 0.05))) for L in lengths])
        tracker.observe(rounds)
        for r in range(2):
            every[r].extend(rounds[r])
        history.append((tracker.curves(), [fit([L for L, _ in o], [t for _, t in o]) for o in every]))
    return history


def batch_error(curve, factor):
    lengths = [48, 90, 200, 350, 640, 900, 1200, 1500]
    truth = factor * sum(TRUE.costs(lengths))
    return sum(curve.costs(lengths)) / truth - 1


def test_tracks_a_rank_that_slows_down():
    history = run()
    # before the change both ranks are predicted within 3%
    tracked, _ = history[SLOW_AT - 1]
    assert abs(batch_error(tracked[0], 1.0)) < 0.03 and abs(batch_error(tracked[1], 1.0)) < 0.03
    # 3 half-lives (12 rounds) after rank 0 slows by 30%, its tracked prediction is within 5%;
    # one fit over its whole history is still more than 10% under
    tracked, plain = history[SLOW_AT + 12]
    assert abs(batch_error(tracked[0], SLOW)) < 0.05
    assert batch_error(plain[0], SLOW) < -0.10
    # and at the end within 3%; the rank that did not change stays within 3%
    tracked, _ = history[-1]
    assert abs(batch_error(tracked[0], SLOW)) < 0.03
    assert abs(batch_error(tracked[1], 1.0)) < 0.03


def test_deterministic_and_calibration_only():
    a, b = run(), run()
    assert [c.as_dict() for c in a[-1][0]] == [c.as_dict() for c in b[-1][0]]
    t = CostTracker([[(L, TRUE(L)) for L in CALIB]])
    assert t.scale(0) == 1.0 and t.curves()[0](500) == pytest.approx(TRUE(500), rel=1e-6)
    t.observe([[]])  # a round in which the rank got no sample changes nothing
    assert t.curves()[0](500) == pytest.approx(TRUE(500), rel=1e-6)
    with pytest.raises(SpecError):
        CostTracker([[(L, TRUE(L)) for L in CALIB]], half_life=0)
    with pytest.raises(SpecError):
        t.observe([[], []])
