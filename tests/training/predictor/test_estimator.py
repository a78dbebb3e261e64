"""The adaptive estimator: how many calls it makes and what it returns, on a scripted clock
(never the real one, so nothing here depends on machine load)."""

from __future__ import annotations

import pytest

from qsync_opt.training.predictor.estimator import robust_ms


class Script:
    """A fake clock and a call whose durations (ms) follow a script, repeating its last value."""

    def __init__(self, durations):
        self.now, self.durations, self.calls = 0.0, list(durations), 0

    def clock(self) -> float:
        return self.now

    def fn(self):
        d = self.durations[min(self.calls, len(self.durations) - 1)]
        self.calls += 1
        self.now += d / 1e3


def test_a_steady_fast_call_stops_after_the_minimum_blocks():
    s = Script([0.5])
    ms = robust_ms(s.fn, clock=s.clock, blocks=5, repeats=5, spread=0.05, budget_ms=1e9)
    assert ms == pytest.approx(0.5)
    assert s.calls == 3 + 3 * 5  # 3 warm-ups (fast first call), 3 blocks of 5: minima agree


def test_a_slow_call_gets_one_warmup_and_one_repeat_per_block():
    s = Script([200.0])
    ms = robust_ms(s.fn, clock=s.clock, blocks=5, repeats=5, spread=0.05, budget_ms=1e9)
    assert ms == pytest.approx(200.0)
    assert s.calls == 1 + 3  # kernel selection done by the first call; 20 ms blocks hold one call


def test_disagreeing_blocks_run_to_the_maximum_and_the_median_minimum_wins():
    # warm-ups 3 x 1 ms; blocks of 5 calls; block minima 1, 2, 4, 1.5, 3 ms: never within 5%
    blocks = [[1.0] * 5, [2.0] * 5, [4.0] * 5, [1.5] * 5, [3.0] * 5]
    s = Script([1.0] * 3 + [d for b in blocks for d in b])
    ms = robust_ms(s.fn, clock=s.clock, blocks=5, repeats=5, spread=0.05, budget_ms=1e9)
    assert s.calls == 3 + 25
    assert ms == pytest.approx(2.0)


def test_the_time_budget_stops_a_noisy_slow_call_after_the_minimum_blocks():
    s = Script([100.0, 100.0, 150.0, 300.0, 120.0, 500.0, 90.0])
    ms = robust_ms(s.fn, clock=s.clock, blocks=5, repeats=5, spread=0.05, budget_ms=250)
    assert s.calls == 1 + 3  # 3 blocks used 570 ms > 250 ms
    assert ms == pytest.approx(150.0)  # median of 100, 150, 300


def test_an_explicit_warmup_and_few_blocks_are_obeyed():
    s = Script([0.0])
    robust_ms(s.fn, clock=s.clock, warmup=2, blocks=1, repeats=1)
    assert s.calls == 2 + 1


def test_fixed_mode_makes_the_same_number_of_calls_whatever_the_times():
    """Collectives (all-reduce, DDP steps) deadlock if ranks time a different number of calls."""
    counts = []
    for script in ([200.0], [0.01], [1.0, 5.0, 0.5, 9.0]):
        s = Script(script)
        robust_ms(s.fn, clock=s.clock, blocks=3, repeats=2, adaptive=False)
        counts.append(s.calls)
    assert counts == [3 + 3 * 2] * 3
