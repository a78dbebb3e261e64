"""solver.time_limit_s bounds a serving call: the search, the relaxations and the baselines share it.

The clock is a fake that advances only inside solves, and each solve takes all the time it was
given (the worst case a real solver may reach), so these tests do not depend on the machine.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import qsync_opt
from qsync_opt.serving import planner
from qsync_opt.solver import budget
from tests.serving.test_serving_plan import spec


class WorstCaseClock:
    """perf_counter for the planner; every solve it wraps spends exactly the limit it was given."""

    def __init__(self):
        self.now = 1000.0
        self.solves: list[tuple[str, float]] = []

    def perf_counter(self) -> float:
        return self.now

    def wrap(self, label, fn, limit_of):
        def run(*args, **kw):
            given = limit_of(*args, **kw)
            self.solves.append((label, given))
            out = fn(*args, **kw)
            self.now += given
            return out
        return run


@pytest.fixture
def clock(monkeypatch):
    c = WorstCaseClock()
    monkeypatch.setattr(planner, "time", SimpleNamespace(perf_counter=c.perf_counter))
    monkeypatch.setattr(budget, "time", SimpleNamespace(perf_counter=c.perf_counter))  # Budget.timed's clock
    monkeypatch.setattr(planner, "solve_serving",
                        c.wrap("solve", planner.solve_serving, lambda inst, be, opts=None, **kw: opts.time_limit_s))
    monkeypatch.setattr(planner, "relaxation_bound",
                        c.wrap("relaxation", planner.relaxation_bound, lambda inst, be="highs", t=10.0: t))
    return c


@pytest.mark.parametrize("limit", [0.5, 3.0, 40.0])
def test_the_whole_call_stays_within_the_limit_even_when_every_solve_uses_all_it_is_given(clock, limit):
    s = spec(orderable=True)
    s["solver"] = {"time_limit_s": limit}
    t0 = clock.now
    plan = qsync_opt.solve(s)
    assert clock.now - t0 <= limit * (1 + 1e-9)
    assert all(given <= limit for _, given in clock.solves)
    # the first candidate got the search's share: a plan, and a status that is a fact
    assert plan.solver.objective_ms > 0
    if plan.solver.statuses.get(planner.OUT_OF_TIME):
        assert plan.solver.status == "feasible"
    # the baselines ran inside the same limit: those it stopped say so
    names = {b.name: b for b in plan.baselines}
    assert set(names) == {"uniform", "pipeedge", "adabits"}
    assert names["uniform"].fits  # no solver: never stopped by time
    for b in plan.baselines:
        if not b.fits and b.name != "uniform":
            assert "time_limit_s ran out" in b.note


def test_baselines_get_their_share_after_a_search_that_uses_all_of_its_own(clock):
    s = spec(orderable=True)
    s["solver"] = {"time_limit_s": 5.0}
    qsync_opt.solve(s)
    search = [g for label, g in clock.solves if label == "solve"]
    # the search's first solve leaves BASELINE_SHARE of the limit unspent
    assert search[0] <= 5.0 * (1 - planner.BASELINE_SHARE) + 1e-9
    assert len(search) >= 2  # ... which the baselines then use


def test_real_clock_generous_limit_is_unchanged():
    """With time to spare every candidate is solved or pruned by its bound, as before the budget."""
    plan = qsync_opt.solve(replace_limit(spec(orderable=True), 60.0))
    assert planner.OUT_OF_TIME not in plan.solver.statuses
    assert plan.solver.status == "optimal"
    assert all(b.fits and "time_limit_s" not in b.note for b in plan.baselines)


def replace_limit(s: dict, limit: float) -> dict:
    return {**s, "solver": {"time_limit_s": limit}}
