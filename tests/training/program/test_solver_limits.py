"""time_limit_s bounds the whole call on instances large enough for every stage to matter.

Regression: at 5,000 ops x 4 groups with a 5 s limit, QSync's greedy warm start alone ran 19 s
(it was charged to the budget but never stopped by it), and at a 60 s limit HiGHS ran 388 s.
The checks read the budget's own accounting and what each stage was given (no sub-solve is granted
more than remained, the warm start gets a deadline inside the limit); the wall clock is only a hang
detector, so they hold on a loaded machine and on a 10x faster one.
"""

from __future__ import annotations

import time

import pytest

from qsync_opt.errors import SolverError
from qsync_opt.solver.budget import Budget
from qsync_opt.training.program.greedy import greedy
from qsync_opt.training.program.instance import evaluate
from qsync_opt.training.program.random_instances import synthetic
from qsync_opt.training.program.solve import WARM_START_SHARE, solve_instance

LIMIT_S = 1.0
HANG_S = 120.0
"""A hang detector only: a stopped solve takes ~LIMIT_S plus model building here, even on a loaded machine."""


@pytest.fixture(scope="module")
def big():
    return synthetic(3000, 5, 4, "chain", seed=1)


@pytest.mark.parametrize("lagrangian", [False, True], ids=["greedy-start", "lagrangian"])
def test_a_small_limit_bounds_the_whole_solve_of_a_large_instance(big, lagrangian, monkeypatch):
    """Load-independent: the greedy warm start gets a deadline inside the limit, every backend call a
    time limit within what remained, and the charged time is what the plan reports. The only clock
    bound is a hang detector (HANG_S), far above the limit and far below the regressions."""
    from qsync_opt.training.program import backend_solve as solve_mod
    from qsync_opt.solver.backends import BACKENDS

    starts, calls = [], []
    real_greedy = solve_mod.greedy

    def watched_greedy(instance, deadline=None, **kw):
        starts.append((time.perf_counter(), deadline))
        return real_greedy(instance, deadline=deadline, **kw)

    monkeypatch.setattr(solve_mod, "greedy", watched_greedy)
    for mod in BACKENDS.values():
        def watched(problem, options, real=mod.solve):
            calls.append(options.time_limit_s)
            return real(problem, options)

        monkeypatch.setattr(mod, "solve", watched)
    budget = Budget(LIMIT_S)
    t0 = time.perf_counter()
    try:
        r = solve_instance(big, backend="highs", threads=1, tie_break=False, budget=budget,
                           lagrangian=lagrangian)
        reported = (r.build_s, r.solve_s)
        assert evaluate(big, r.assignment).feasible
    except SolverError as e:  # no plan within the limit is an honest answer too
        assert "raise time_limit_s" in str(e)
        reported = (budget.build_s, budget.spent_s)
    wall = time.perf_counter() - t0
    assert reported == pytest.approx((budget.build_s, budget.spent_s))
    for label, given, left in budget.grants:
        assert given <= left + 1e-9, label
    assert all(c <= LIMIT_S + 1e-9 for c in calls), calls  # HiGHS once ran 388 s at a 60 s limit (none: no time left)
    for at, deadline in starts:  # greedy once ran 19 s at a 5 s limit: it was never given a deadline
        assert deadline is not None and deadline - at <= WARM_START_SHARE * LIMIT_S + 1e-6
    granted = [g for _, g, _ in budget.grants]
    assert all(any(abs(c - g) <= 1e-9 for g in granted) for c in calls), (calls, budget.grants)  # each from a grant
    assert wall <= HANG_S, (wall, budget.grants)


def test_greedy_past_its_deadline_returns_the_fastest_plan_at_once(big):
    inst = synthetic(200, 5, 2, "dag", seed=3)
    cut = greedy(inst, deadline=0.0)
    full = greedy(inst)
    assert cut.feasible and not cut.complete and cut.steps == 0 and cut.reason == "stopped at the deadline"
    assert full.complete and full.steps > 0
    fastest = {g.name: {op: min(ps, key=lambda p: g.time_ms[op][p]) for op, ps in g.allowed.items()} for g in inst.groups}
    assert cut.assignment == fastest
    assert evaluate(inst, cut.assignment).degradation >= evaluate(inst, full.assignment).degradation
