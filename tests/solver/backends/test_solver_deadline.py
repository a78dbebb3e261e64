"""SolveOptions.deadline: the solver's own limit is cut, after the model is built, to what is left of the caller's
deadline; without one, `time_limit_s` is handed on as before. Spies record the limit each backend gives its solver
(no timing: a deadline already passed must leave only the minimum)."""

from __future__ import annotations

import time

import pytest

from qsync_opt.solver.backends import SolveOptions, get_backend
from qsync_opt.solver.backends.base import seconds_left
from qsync_opt.solver.problem import Problem
from tests.training.program.solver_cases import AVAILABLE


def _problem() -> Problem:
    p = Problem("tiny")
    for v in ("a", "b", "c"):
        p.add_var(v)
        p.objective[v] = {"a": 3.0, "b": 2.0, "c": 4.0}[v]
    p.add_onehot("pick", ["a", "b", "c"])
    return p


def test_seconds_left_cuts_the_limit_to_the_deadline():
    assert seconds_left(SolveOptions(time_limit_s=7.0)) == 7.0
    assert seconds_left(SolveOptions(time_limit_s=7.0, deadline=time.perf_counter() + 1e4)) == 7.0
    assert seconds_left(SolveOptions(time_limit_s=7.0, deadline=time.perf_counter() - 1.0)) == 1e-3
    left = seconds_left(SolveOptions(time_limit_s=7.0, deadline=time.perf_counter() + 2.0))
    assert 1.0 < left <= 2.0


def _spy_limits(monkeypatch, backend: str) -> list[float]:
    """Record the time limit (seconds) `backend` hands its solver."""
    seen: list[float] = []
    if backend == "highs":
        import highspy

        real = highspy.Highs.setOptionValue

        def set_option(self, key, value):
            if key == "time_limit":
                seen.append(float(value))
            return real(self, key, value)

        monkeypatch.setattr(highspy.Highs, "setOptionValue", set_option)
    elif backend == "scip":
        from ortools.linear_solver import pywraplp

        real = pywraplp.Solver.SetTimeLimit
        monkeypatch.setattr(pywraplp.Solver, "SetTimeLimit", lambda self, ms: (seen.append(ms / 1000), real(self, ms))[1])
    elif backend == "cpsat":
        from ortools.sat.python import cp_model

        real = cp_model.CpSolver.solve
        monkeypatch.setattr(cp_model.CpSolver, "solve",
                            lambda self, m, *a, **k: (seen.append(self.parameters.max_time_in_seconds),
                                                      real(self, m, *a, **k))[1])
    elif backend == "cbc":
        import pulp

        real = pulp.PULP_CBC_CMD.__init__

        def init(self, *a, **k):
            seen.append(float(k["timeLimit"]))
            real(self, *a, **k)

        monkeypatch.setattr(pulp.PULP_CBC_CMD, "__init__", init)
    return seen


@pytest.mark.parametrize("backend", [b for b in ("highs", "cbc", "scip", "cpsat") if AVAILABLE[b]])
def test_backend_hands_its_solver_what_is_left_of_the_deadline(monkeypatch, backend):
    seen = _spy_limits(monkeypatch, backend)
    res = get_backend(backend).solve(_problem(), SolveOptions(time_limit_s=60.0))
    assert res.status == "optimal" and seen and all(s == pytest.approx(60.0) for s in seen)
    seen.clear()
    # a deadline that has already passed (as when building the model used it up): the solver gets the minimum
    res = get_backend(backend).solve(_problem(), SolveOptions(time_limit_s=60.0, deadline=time.perf_counter() - 1.0))
    assert seen and max(seen) <= 0.01, seen
    assert res.status in ("optimal", "feasible", "unknown")  # a 1 ms run may or may not finish; it must not claim more


def test_stop_at_deadline_watches_only_with_a_deadline_and_never_stops_a_solve_that_returned():
    import threading

    import qsync_opt.solver.backends.base as base

    def watchers():  # by name: other tests' or libraries' threads may start and stop meanwhile
        return [t for t in threading.enumerate() if t.name == "stop-at-deadline"]

    calls = []
    with base.stop_at_deadline(SolveOptions(), lambda: calls.append(1)):
        assert watchers() == []  # no watcher without a deadline
    with base.stop_at_deadline(SolveOptions(deadline=time.perf_counter() + 30.0), lambda: calls.append(1)):
        assert len(watchers()) == 1
    assert watchers() == []  # the solve returned: its watcher is gone, and it never called stop
    assert calls == []


def test_stop_at_deadline_calls_stop_once_the_deadline_has_passed():
    import threading

    from qsync_opt.solver.backends.base import stop_at_deadline

    fired = threading.Event()
    with stop_at_deadline(SolveOptions(deadline=time.perf_counter() - 1.0), fired.set):
        assert fired.wait(30.0)  # a solver still running would be stopped now


def test_stop_request_repeats_until_the_solve_returns():
    """A solver drops a stop request that arrives before its search starts (SCIP while OR-Tools builds its model), so
    the request repeats until the solve returns; none is sent after."""
    import threading

    from qsync_opt.solver.backends.base import stop_at_deadline

    calls, third = [], threading.Event()

    def stop():
        calls.append(1)
        if len(calls) >= 3:
            third.set()

    with stop_at_deadline(SolveOptions(deadline=time.perf_counter() - 1.0), stop):
        assert third.wait(30.0)  # the first two were "dropped": it kept asking
    n = len(calls)
    time.sleep(0.01)
    assert len(calls) == n  # nothing after the solve returned


@pytest.mark.parametrize("backend,stop", [("scip", "InterruptSolve"), ("cpsat", "stop_search")])
def test_scip_and_cpsat_are_stopped_at_the_deadline(monkeypatch, backend, stop):
    if not AVAILABLE[backend]:
        pytest.skip(f"{backend} not available")
    import contextlib
    import importlib

    mod = importlib.import_module(f"qsync_opt.solver.backends.{backend}")
    armed = []

    @contextlib.contextmanager
    def spy(options, fn):
        armed.append((options.deadline, getattr(fn, "__name__", "")))
        yield

    monkeypatch.setattr(mod, "stop_at_deadline", spy)
    deadline = time.perf_counter() + 60.0
    get_backend(backend).solve(_problem(), SolveOptions(time_limit_s=60.0, deadline=deadline))
    assert armed and all(d == deadline and name == stop for d, name in armed), armed


def _scip_answering(monkeypatch, code_name: str, wait_for_stop: bool):
    """SCIP's Solve replaced by one that (optionally) waits for the interrupt, then answers `code_name`."""
    import threading

    from ortools.linear_solver import pywraplp

    interrupted = threading.Event()
    monkeypatch.setattr(pywraplp.Solver, "InterruptSolve", lambda self: (interrupted.set(), True)[1])

    def solve(self, *a):
        if wait_for_stop:
            assert interrupted.wait(30.0)
        return getattr(pywraplp.Solver, code_name)

    monkeypatch.setattr(pywraplp.Solver, "Solve", solve)


@pytest.mark.skipif(not AVAILABLE["scip"], reason="OR-Tools built without SCIP")
def test_scip_stopped_at_the_deadline_is_unknown_not_an_error(monkeypatch):
    """Interrupted at the deadline, SCIP sometimes answers ABNORMAL (seen under load in CI): the solve was stopped, not
    broken, so the status is "unknown" with no values, as for NOT_SOLVED."""
    _scip_answering(monkeypatch, "ABNORMAL", wait_for_stop=True)
    res = get_backend("scip").solve(_problem(), SolveOptions(time_limit_s=60.0, deadline=time.perf_counter() - 1.0))
    assert res.status == "unknown" and res.values is None and res.objective is None
    assert "deadline" in res.message


@pytest.mark.skipif(not AVAILABLE["scip"], reason="OR-Tools built without SCIP")
def test_scip_abnormal_without_a_stop_request_stays_an_error(monkeypatch):
    _scip_answering(monkeypatch, "ABNORMAL", wait_for_stop=False)
    res = get_backend("scip").solve(_problem(), SolveOptions(time_limit_s=60.0))
    assert res.status == "error"
    # a deadline still far off: no stop was requested, so ABNORMAL is SCIP's own failure
    res = get_backend("scip").solve(_problem(), SolveOptions(time_limit_s=60.0, deadline=time.perf_counter() + 1e4))
    assert res.status == "error"


@pytest.mark.skipif(not AVAILABLE.get("cpsat"), reason="OR-Tools CP-SAT not installed")
def test_cpsat_model_is_freed_when_the_solve_returns_not_by_the_collector():
    """A CpModel left in a reference cycle lived until the next collection: under repack's paused collector that
    was after the decision, inside the call. With the collector off, no model may outlive the solve."""
    import gc

    from ortools.sat.python import cp_model

    gc.collect()
    was = gc.isenabled()
    gc.disable()
    try:
        raw = get_backend("cpsat").solve(_problem(), SolveOptions(time_limit_s=5.0, threads=1))
        alive = [o for o in gc.get_objects() if isinstance(o, cp_model.CpModel)]
    finally:
        if was:
            gc.enable()
    assert raw.status in ("optimal", "feasible")
    assert alive == []
