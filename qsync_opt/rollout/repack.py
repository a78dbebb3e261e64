"""Repack: consolidate in-flight long-tail trajectories onto few rollouts, freeing the rest.

At a repack tick the rollout manager knows, for each in-flight trajectory, its worker, its context
so far and its predicted remaining tokens, and for each worker its KV capacity, its batch cap, the
value of freeing it (what it produces if it can pull new weights and start fresh work now) and
what it costs per context token to move a trajectory onto it (re-prefill or KV transfer, whichever
is cheaper). Choose which workers keep running and where each trajectory goes:

    maximise   Σ_w value_w · (1 − keep_w)  −  Σ_{j, w ≠ src(j)} cost_{j,w} · x_{j,w}
    subject to Σ_w x_{j,w} = 1                              every trajectory has one worker
               x_{j,w} ≤ keep_w                              only kept workers run trajectories
               Σ_j need_j · x_{j,w} ≤ cap_w · keep_w          need = context + remaining (final KV)
               Σ_j x_{j,w} ≤ batch_w · keep_w                 decode-batch cap

with cap_w = max(kv_threshold · capacity_w, what w already holds) and batch_w likewise (staying
put is always allowed; only what a worker receives is bounded by the threshold and the cap).

Two exact forms on the shared problem IR (qsync_opt.solver.problem), solved by any exact backend
(highs, cbc, scip, cpsat) with best-fit as the warm start:

* ``full``: the program above, one binary per (trajectory, worker); used when it is small.
* ``aggregate``: keep_w binaries only, with covering rows Σ keep_w·cap_w ≥ Σ need and
  Σ keep_w·batch_w ≥ #trajectories, and each freed worker's trajectories priced at their cheapest
  destination. It relaxes the full program (its optimum bounds the full one from above); its keep
  set is then packed by best-fit decreasing. When the packing succeeds at the relaxation's value
  the plan is proven optimal; otherwise a no-good cut is added and the loop goes on until the time
  limit, and the result is "feasible" with the true gap to the relaxation's bound.

Either form decides which workers to free; their trajectories then go where best-fit would send them (freed worker
by freed worker from the least loaded up, largest first, each to its tightest fit): the full form's own placement is
kept only where that one would cost objective. Placement order does not show in a tick's objective, but in the
simulator it moved whole runs by 0.3-0.6% (docs/rollout.md, "Ten steps flattered the program").

`repack(state)` never returns a plan worse than best-fit (it keeps best-fit when the program finds
nothing better in time).

Example (an RL framework's rollout manager, every tick)::

    from qsync_opt.rollout.repack import RepackState, RepackWorker, RepackTraj, repack, warm_up

    warm_up("highs", freeze=True)  # once, at start-up, after the model is loaded: see warm_up

    workers = [RepackWorker("w0", kv_capacity=8000, batch_cap=8, value=500.0, move_cost_per_token=0.01),
               RepackWorker("w1", kv_capacity=8000, batch_cap=8, value=500.0, move_cost_per_token=0.01)]
    trajs = [RepackTraj("t0", worker="w0", context=900, remaining=3000),
             RepackTraj("t1", worker="w1", context=700, remaining=2500)]
    result = repack(RepackState(workers, trajs, kv_threshold=0.9))
    result.freed   # ['w0'] or ['w1']: one worker can take both tails
    result.moves   # [Move(traj='t0', src='w0', dst='w1', cost=9.0)] (or the mirror)
"""

from __future__ import annotations

import gc
import time
from contextlib import contextmanager
from typing import Literal

from qsync_opt.errors import SolverError
from qsync_opt.rollout.repack_best_fit import OutOfTime, best_fit, pack_kept
from qsync_opt.rollout.repack_model import (
    Evaluation,
    Move,
    RepackResult,
    RepackState,
    RepackTraj,
    RepackWorker,
    brute_force,
    evaluate,
    repack_result,
)
from qsync_opt.rollout.repack_program import solve_aggregate, solve_full, stop_latency
from qsync_opt.solver.backends import EXACT

__all__ = ["FULL_LIMIT", "Evaluation", "Move", "RepackResult", "RepackState", "RepackTraj", "RepackWorker", "best_fit",
           "brute_force", "evaluate", "repack", "warm_up"]

SOLVER_SLACK_S = 0.003
"""Kept back from the solver's deadline for its overshoot of its own limit, at least (HiGHS's overshoot on the repack
timing state: docs/rollout.md); more once a backend has been seen later than that (repack_program.stop_latency), up
to SLACK_CAP of the limit."""

SLACK_CAP = 0.2
"""The most of a call's limit kept back for a backend's overshoot: one outlier must not starve every later solve."""

FULL_LIMIT = 1500
"""Largest trajectories × workers count solved in the full form (beyond it: the aggregate form)."""


def repack(state: RepackState, method: Literal["program", "best-fit"] = "program", backend: str = "highs",
           time_limit_s: float = 0.05, form: Literal["auto", "full", "aggregate"] = "auto",
           max_rounds: int | None = None) -> RepackResult:
    """Decide which workers keep running and where each in-flight trajectory goes.

    method 'best-fit' is Laminar's heuristic; 'program' solves the integer program above (form 'full'
    when trajectories × workers ≤ FULL_LIMIT, else 'aggregate') with best-fit as warm start, within
    `time_limit_s`, and never returns less than best-fit. Status 'optimal' only when proven.
    `max_rounds` bounds the aggregate form's solve-and-pack rounds (a deterministic budget beside the clock:
    the simulator uses it so that its plans do not depend on the machine's load).

    The limit is a deadline for the whole call: the backend's model conversion counts against it
    (SolveOptions.deadline) and Python's cyclic collector is paused for the call (a full collection in a
    process holding torch can take longer than the default budget: docs/rollout.md). The first call with a
    backend in a process imports it (CP-SAT's import alone can outlast a tick): `warm_up(backend)` at start-up
    moves that off the tick.
    """
    with _collector_paused():
        return _repack(state, method, backend, time_limit_s, form, max_rounds)


def warm_up(backend: str = "highs", freeze: bool = False) -> None:
    """Import `backend` and run one tiny repack with it, so that the first real tick meets its deadline.

    It ends with a full collection (off the tick): the backend's import leaves many new long-lived objects, and the
    full collection they make due otherwise landed within the first decisions. `freeze=True` then calls
    `gc.freeze()`: every object alive now (torch, the model, the framework) moves to the collector's permanent
    generation and is never scanned again. `repack` pauses the collector during a decision, so the collection its
    allocations trigger runs as the collector resumes, before the call returns; a full collection in a process
    holding torch can take longer than a decision's budget, a frozen one a small part of it (docs/rollout.md has the
    measurements). A process that keeps allocating still makes a full collection due now and then, which only the
    freeze makes cheap. The cost of freezing: objects alive at the freeze that later become cyclic garbage are never
    freed (refcounting still frees the rest): freeze once, at start-up, after loading
    what the process keeps."""
    w = [RepackWorker("a", 100, 2, 10.0, 0.01), RepackWorker("b", 100, 2, 10.0, 0.01)]
    repack(RepackState(w, [RepackTraj("t0", "a", 10, 10), RepackTraj("t1", "b", 10, 10)], 0.9), backend=backend,
           time_limit_s=1.0, form="full")
    # A full collection now, off the tick: the import left many new long-lived objects, which would make the next
    # full collection due within the first few dozen decisions. Before a freeze, it also keeps the garbage of
    # start-up out of the permanent generation.
    gc.collect()
    if freeze:
        gc.freeze()


def _laminar_placement(state: RepackState, placement: dict[str, str], got: Evaluation, deadline: float):
    """The full form's keep set placed as best-fit places (repack_best_fit.pack_kept), when that packs it at an
    objective no lower: the solver is indifferent among receivers of one move cost, and its choice among them packed 0.3-0.6%
    worse end to end than best-fit's tightest fits (the simulator, 64 A100). Else the solver's own placement."""
    keep = set(placement.values())
    try:
        alt = pack_kept(state, keep, deadline=deadline)
    except OutOfTime:
        return placement, got
    if alt is None:
        return placement, got
    g2 = evaluate(state, alt)
    if g2.violations or g2.objective < got.objective - 1e-9 * max(1.0, abs(got.objective)):
        return placement, got
    return alt, g2


@contextmanager
def _collector_paused():
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _repack(state: RepackState, method: str, backend: str, time_limit_s: float, form: str,
            max_rounds: int | None) -> RepackResult:
    if not 0 < state.kv_threshold <= 1:
        raise SolverError(f"kv_threshold {state.kv_threshold} must be in (0, 1]")
    ids = [w.id for w in state.workers]
    if len(set(ids)) != len(ids):
        raise SolverError("repack: worker ids must be unique")
    known = set(ids)
    for t in state.trajectories:
        if t.worker not in known:
            raise SolverError(f"repack: trajectory {t.id!r} is on unknown worker {t.worker!r}")
    t0 = time.perf_counter()
    start = best_fit(state)
    pack_s = time.perf_counter() - t0  # one packing of the program's answer costs about as much
    if method == "best-fit":
        return repack_result(state, start, "best-fit", t0, bound=None, status="feasible")
    if backend not in EXACT:
        raise SolverError(f"repack: backend {backend!r} is not exact; use one of {', '.join(EXACT)}")
    t1 = time.perf_counter()
    base = evaluate(state, start).objective
    # kept back from the solver's deadline besides packing its answer (pack_s, about one best-fit): the two
    # evaluations after it (the packing's, then repack_result's with its moves) and the solver's overshoot
    post_s = 2 * (time.perf_counter() - t1) + stop_latency(backend, SOLVER_SLACK_S, SLACK_CAP * time_limit_s)
    if not state.trajectories:
        return repack_result(state, start, "program", t0, bound=base, status="optimal", backend=backend, form="none",
                       baseline_objective=base)
    use = form if form != "auto" else ("full" if len(state.trajectories) * len(ids) <= FULL_LIMIT else "aggregate")
    if use == "full":
        placement, bound, status = solve_full(state, backend, time_limit_s, start, t0, pack_s + post_s)
        got = evaluate(state, placement) if placement is not None else None
        if got is not None and not got.violations:
            placement, got = _laminar_placement(state, placement, got, t0 + time_limit_s - post_s)
        if got is None or got.violations or got.objective < base:
            placement, obj = start, base
        else:
            obj = got.objective
        # signed on the true gap (as solver.solve does): CP-SAT's own status speaks for a rounded copy
        proven = bound is not None and obj >= bound - 1e-6 * max(1.0, abs(bound))
    else:
        # its objective comes back with it, so the plan is not evaluated again here: that would run past the reserve
        placement, bound, proven, obj = solve_aggregate(state, backend, time_limit_s, start, t0, max_rounds, pack_s,
                                                   post_s, base)
    if bound is not None:
        bound = max(bound, obj)
    return repack_result(state, placement, "program", t0, bound=bound, status="optimal" if proven else "feasible",
                   backend=backend, form=use, baseline_objective=base)
