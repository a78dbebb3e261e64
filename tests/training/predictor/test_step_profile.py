"""The profiler's whole steps are timed adaptively: how many steps, and which median, on a
scripted clock (never the real one, so nothing here depends on machine load)."""

from __future__ import annotations

import statistics

import pytest

from qsync_opt.training.predictor.step_profile import adaptive_step_times_ms, median_settled


class Steps:
    """A fake clock and a step whose durations (ms) follow a script, repeating its last value."""

    def __init__(self, durations):
        self.now, self.durations, self.calls = 0.0, list(durations), 0

    def clock(self) -> float:
        return self.now

    def step(self):
        self.now += self.durations[min(self.calls, len(self.durations) - 1)] / 1e3
        self.calls += 1


def test_steady_steps_stop_at_the_floor_after_one_warmup():
    s = Steps([300.0, 100.0, 101.0, 99.0, 100.0, 100.5, 100.0])
    ts = adaptive_step_times_ms(s.step, warmup=1, least=5, most=25, tol=0.02, clock=s.clock)
    assert len(ts) == 5 and s.calls == 6  # the slow first step is untimed
    assert statistics.median(ts) == pytest.approx(100.0)


def test_a_noisy_start_keeps_timing_until_the_median_settles():
    # five scattered steps (median 100, 115 without the last), then a steady 110 ms
    s = Steps([100.0, 130.0, 90.0, 140.0, 80.0] + [110.0] * 30)
    ts = adaptive_step_times_ms(s.step, warmup=0, least=5, most=25, tol=0.02, clock=s.clock)
    assert len(ts) == 9  # medians 100, 105, 110, 110, 110: the last two moved it by 0
    assert statistics.median(ts) == pytest.approx(110.0)
    assert median_settled(ts, 0.02) and not median_settled(ts[:-1], 0.02)


def test_a_median_that_never_settles_stops_at_the_cap():
    s = Steps([100.0 * 1.05 ** i for i in range(50)])  # each step 5% slower than the last
    ts = adaptive_step_times_ms(s.step, warmup=0, least=5, most=12, tol=0.02, clock=s.clock)
    assert len(ts) == 12


def test_ranks_that_agree_stop_together_on_the_shared_times():
    # this rank is steady; the slowest rank's times (what `agree` returns) keep the median moving
    shared = iter([100.0, 130.0, 90.0, 140.0, 80.0, 150.0, 100.0, 100.0, 100.0, 100.0, 100.0, 100.0] + [100.0] * 20)
    s = Steps([50.0])
    ts = adaptive_step_times_ms(s.step, warmup=0, least=5, most=25, tol=0.02, agree=lambda ms: next(shared),
                                clock=s.clock)
    assert len(ts) > 5  # a rank alone would have stopped at the floor
    assert ts == pytest.approx([50.0] * len(ts))  # its own times are what it returns


def test_median_settled_reads_the_last_two_steps():
    assert median_settled([100.0, 100.0, 100.0, 101.0, 100.0], 0.02)
    assert not median_settled([100.0, 100.0, 90.0, 80.0, 70.0], 0.02)
    assert not median_settled([100.0, 100.0], 0.02)  # too few to say
