"""What every backend takes and returns, and the one place raw solver values become a result.

A backend reports the status its solver reported (never PuLP's "Optimal" at a time limit);
the objective is always recomputed here from the Problem's real coefficients, so a backend
that solved a scaled or rounded copy cannot misstate what its plan is worth.
"""

from __future__ import annotations

import math
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Literal, Protocol

from qsync_opt.solver.backends.linear import linearize
from qsync_opt.solver.budget import DEFAULT_TIME_LIMIT_S
from qsync_opt.solver.problem import Problem

OPTIMALITY_TOL = 1e-7
"""Relative gap under which a plan counts as optimal even when rel_gap is 0: the floating-point
noise of a bound computed by a solver (and of CP-SAT's rounding), far below any real choice."""
ABS_TOL = 1e-18
"""Absolute slack in plan units, for objectives at or near 0 (every op at fp32)."""


def proven_within(objective: float, bound: float | None, rel_gap: float) -> tuple[bool, float | None]:
    """(objective is proven within rel_gap of the optimum by `bound`, the true relative gap)."""
    if bound is None:
        return False, None
    diff = max(0.0, objective - bound)
    ok = diff <= max(rel_gap, OPTIMALITY_TOL) * max(abs(objective), abs(bound)) + ABS_TOL
    return ok, diff / max(abs(objective), ABS_TOL)


Status = Literal["optimal", "feasible", "infeasible", "unknown", "error"]
"""optimal: proven within rel_gap; feasible: a plan, stopped at a limit (or a heuristic);
infeasible: proven; unknown: stopped at a limit with no plan and no proof; error: solver failed."""


@dataclass(frozen=True)
class SolveOptions:
    time_limit_s: float = DEFAULT_TIME_LIMIT_S
    """This one solver run's limit (a caller's Budget grants it)."""
    rel_gap: float = 1e-4
    """Stop when (objective − bound) / |objective| ≤ rel_gap. 0 asks for a proven optimum."""
    threads: int | None = None
    """None: the solver's default."""
    seed: int = 0
    hint: dict[str, float] | None = None
    """Complete values of the Problem's variables for a warm start (Problem.encode)."""
    deterministic_time_s: float | None = None
    """CP-SAT only (others ignore it): a work budget in CP-SAT's deterministic time; with one
    thread a run stopped by it gives the same plan on every run, which a wall-clock limit does not."""
    formulation: str = "mccormick"
    """How products are linearised: 'mccormick' or 'marginal' (backends/linear.py)."""
    msg: bool = False
    deadline: float | None = None
    """A `time.perf_counter()` instant by which the caller needs the answer. The solver's own limit is
    then cut, after the model is built, to what is left of it (`seconds_left`): building the model
    counts against a caller's deadline, where `time_limit_s` alone bounds the search only."""


def seconds_left(options: SolveOptions) -> float:
    """The limit to give the solver now: `time_limit_s`, cut to what is left before `options.deadline`."""
    left = options.time_limit_s
    if options.deadline is not None:
        left = min(left, options.deadline - time.perf_counter())
    return max(left, 1e-3)


STOP_REPEAT_S = 0.001
"""How often `stop_at_deadline` repeats its stop request once the deadline has passed."""


@dataclass
class StopRequests:
    """What `stop_at_deadline` did: `sent` is True once it has asked the solver to stop."""

    sent: bool = False


@contextmanager
def stop_at_deadline(options: SolveOptions, stop):
    """Call `stop()` from a thread once `options.deadline` has passed, and again every STOP_REPEAT_S until the solve
    inside returns (nothing without a deadline). For solvers that can be stopped from another thread and overshoot
    their own limit: SCIP (`InterruptSolve`), CP-SAT (`stop_search`). Repeated, because a request that arrives before
    the solver has entered its search is dropped: OR-Tools builds SCIP's model inside `Solve`, and a request sent
    during that build is lost, leaving SCIP to run on to its own limit.

    Yields a `StopRequests`: its `sent` says, once the solve has returned, whether a stop was requested, so a backend
    can tell a solver that failed from one it stopped (SCIP may answer an interrupt with ABNORMAL)."""
    requests = StopRequests()
    if options.deadline is None:
        yield requests
        return
    done = threading.Event()

    def watch():
        if done.wait(max(0.0, options.deadline - time.perf_counter())):
            return  # returned in time
        while True:
            requests.sent = True
            stop()
            if done.wait(STOP_REPEAT_S):
                return

    watcher = threading.Thread(target=watch, name="stop-at-deadline", daemon=True)
    watcher.start()
    try:
        yield requests
    finally:
        done.set()
        watcher.join()  # no request may reach a solver after its solve has returned


@dataclass
class RawResult:
    backend: str
    status: Status
    values: dict[str, float] | None = None
    """Complete values of the Problem's variables (pairs and epigraph settled)."""
    objective: float | None = None
    """In the user's units, recomputed from the real coefficients."""
    bound: float | None = None
    """Solver's best bound, user's units (CP-SAT: the bound of its scaled model)."""
    gap: float | None = None
    wall_s: float = 0.0
    warm_start_used: bool = False
    scaling: dict | None = None
    """CP-SAT only: scale bits and the largest rounding error of the objective and of any row."""
    message: str = ""
    extra: dict = field(default_factory=dict)
    build_s: float = 0.0
    """Part of wall_s spent building the model (linearising, writing it into the solver)."""
    bound_in_plan_units: bool = True
    """False when `bound` belongs to a rounded copy of the program (CP-SAT's tightened rows)
    and so proves nothing about the real one; solve.sign then drops it."""


class Backend(Protocol):
    name: str

    def available(self) -> bool: ...

    def solve(self, problem: Problem, options: SolveOptions) -> RawResult: ...


def result_from_values(
    backend: str,
    problem: Problem,
    status: Status,
    solver_values: dict[str, float] | None,
    bound_raw: float | None,
    wall_s: float,
    **kw,
) -> RawResult:
    """Build a RawResult: pick the Problem's integer variables, settle the rest, recompute the objective.

    `bound_raw` is in solver units without the objective constant (as solvers report it).
    """
    if status in ("optimal", "feasible") and solver_values is not None:
        # integers are rounded, products and minimised continuous variables settled from them;
        # other continuous variables (a linear file's products) keep the solver's values
        values = problem.complete({v: solver_values.get(v, 0.0) for v in problem.variables})
        objective = problem.objective_value(values)
    else:
        values, objective = None, None
    bound = None
    if bound_raw is not None and math.isfinite(bound_raw) and abs(bound_raw) < 1e19:  # solvers' "infinity"
        bound = (bound_raw + problem.objective_constant) * problem.objective_unit
    gap = kw.pop("gap", None)
    if gap is None and objective is not None and bound is not None:
        gap = max(0.0, objective - bound) / max(abs(objective), 1e-12)
    return RawResult(backend, status, values, objective, bound, gap, wall_s, **kw)


@dataclass
class Prologue:
    """What every backend does before it builds its own model (one helper, one behaviour)."""

    model: object
    """The LinearModel."""
    hint: dict[str, float] | None
    """Warm start on the linearised variables, or None."""
    early: RawResult | None
    """An answer found without a solver (constant rows that fail), or None."""
    t0: float


def prologue(problem: Problem, options: SolveOptions, backend: str) -> Prologue:
    """Linearise, check the variable-free rows, map the warm start onto the linear model."""
    t0 = time.perf_counter()
    model = linearize(problem, options.formulation)
    early = constant_infeasibility(model, backend, t0)
    hint = model.hint(options.hint) if options.hint and early is None else None
    return Prologue(model, hint, early, t0)


def constant_infeasibility(model, backend: str, t0: float | None = None) -> RawResult | None:
    """An 'infeasible' result when the linearised model's variable-free rows already fail, else None.

    Such rows (every op of a group pinned, and its fixed time or memory over the bound) prove
    infeasibility before any search, and no solver needs to be started for them.
    """
    if not model.violated_constants:
        return None
    wall = 0.0 if t0 is None else time.perf_counter() - t0
    return RawResult(backend, "infeasible", wall_s=wall, message="; ".join(model.violated_constants))
