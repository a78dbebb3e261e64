"""The repack integer programs on the shared problem IR (qsync_opt.solver.problem): the full form (one
binary per trajectory and worker) and the aggregate form (keep binaries with covering rows, packed by
best-fit decreasing, with no-good cuts until proven or out of time). See rollout.repack's docstring
for the program; `repack` there chooses the form."""

from __future__ import annotations

import threading
import time
from collections import deque

from qsync_opt.rollout.repack_best_fit import OutOfTime, pack_kept
from qsync_opt.rollout.repack_model import RepackState, evaluate
from qsync_opt.solver.backends import get_backend
from qsync_opt.solver.backends.base import SolveOptions
from qsync_opt.solver.problem import Problem


PROOF_GAP = 1e-6
"""repack.py calls a placement optimal when its objective is within this relative gap of the bound."""


STOP_WINDOW = 32
"""Solves per backend whose lateness `stop_latency` remembers."""
_late: dict[str, deque] = {}
_late_lock = threading.Lock()


def note_lateness(backend: str, seconds: float) -> None:
    """Record how long past the deadline it was given a solve of `backend` returned (negative: early)."""
    with _late_lock:
        _late.setdefault(backend, deque(maxlen=STOP_WINDOW)).append(seconds)


def stop_latency(backend: str, floor_s: float, cap_s: float) -> float:
    """What to keep back from a solve's deadline for `backend`'s overshoot of it: the latest of its last STOP_WINDOW
    solves in this process, at least `floor_s`, at most `cap_s`. Each backend overshoots a deadline at its own
    pace, and a loaded machine stretches that, so no fixed reserve fits all (docs/rollout.md has the figures)."""
    with _late_lock:
        seen = max(_late.get(backend, ()), default=0.0)
    return min(cap_s, max(floor_s, seen))


def _solve(backend: str, p: Problem, deadline: float, hint=None):
    raw = get_backend(backend).solve(p, _opts(deadline, hint))
    note_lateness(backend, time.perf_counter() - deadline)
    return raw


def _opts(deadline: float, hint=None) -> SolveOptions:
    """Options for one solve that must return by `deadline` (a perf_counter instant): the backend's model
    conversion counts against it (SolveOptions.deadline)."""
    # ask the backend for half the gap the proof accepts: a backend stopping right at the proof's
    # own tolerance (CBC did, 8.38e-4 against 8.38e-4 on 838) flips between optimal and feasible
    return SolveOptions(time_limit_s=max(deadline - time.perf_counter(), 1e-3), rel_gap=PROOF_GAP / 2, hint=hint,
                        threads=1, deadline=deadline)


def _limit_row(p: Problem, state: RepackState) -> None:
    """Σ (1 − keep_w) ≤ max_freed, over the workers that hold trajectories (empty ones are free anyway)."""
    if state.max_freed is None:
        return
    busy = sorted({t.worker for t in state.trajectories})
    p.add_constraint("max_freed", {f"keep_{w}": 1.0 for w in busy}, ">=", float(len(busy) - state.max_freed))


def solve_full(state: RepackState, backend: str, time_limit_s: float, start: dict[str, str], t0: float,
          reserve_s: float):
    """The full program; the solver gets what is left of `time_limit_s` since `t0` (building the
    program counts against it) less `reserve_s`, the caller's work after it (evaluating the answer)."""
    caps = state.caps()
    p = Problem("repack-full")
    wk = {w.id: w for w in state.workers}
    total_value = sum(w.value for w in state.workers)
    for w in state.workers:
        p.add_var(f"keep_{w.id}")  # 1: worker w keeps running trajectories
        p.objective[f"keep_{w.id}"] = w.value
    allowed = {(t.id, w.id) for t in state.trajectories for w in state.workers if state.allowed(t, w.id)}
    for t in state.trajectories:
        names = []
        for w in state.workers:
            if (t.id, w.id) not in allowed:
                continue
            v = p.add_var(f"x_{t.id}_{w.id}")  # 1: trajectory t runs on worker w after the repack
            names.append(v)
            c = state.cost(t, w)
            if c:
                p.objective[v] = c
            p.add_constraint(f"on_kept_{t.id}_{w.id}", {v: 1.0, f"keep_{w.id}": -1.0}, "<=", 0.0)
        p.add_onehot(f"one_{t.id}", names)
    for w in state.workers:
        kv = {f"x_{t.id}_{w.id}": float(t.need) for t in state.trajectories if (t.id, w.id) in allowed}
        kv[f"keep_{w.id}"] = -caps[w.id][0]
        p.add_constraint(f"kv_{w.id}", kv, "<=", 0.0)
        nb = {f"x_{t.id}_{w.id}": 1.0 for t in state.trajectories if (t.id, w.id) in allowed}
        nb[f"keep_{w.id}"] = -float(caps[w.id][1])
        p.add_constraint(f"batch_{w.id}", nb, "<=", 0.0)
    p.objective_constant = -total_value
    _limit_row(p, state)
    hint = {f"keep_{w}": float(any(d == w for d in start.values())) for w in wk}
    hint.update({f"x_{t.id}_{w}": float(start[t.id] == w) for t in state.trajectories for w in wk
                 if (t.id, w) in allowed})
    raw = _solve(backend, p, t0 + time_limit_s - reserve_s, hint)
    if raw.values is None:
        return None, None, raw.status
    placement = {}
    for t in state.trajectories:
        placement[t.id] = max(wk, key=lambda w: raw.values.get(f"x_{t.id}_{w}", 0.0))
    bound = -raw.bound if raw.bound is not None and raw.bound_in_plan_units else None
    return placement, bound, raw.status


def solve_aggregate(state: RepackState, backend: str, time_limit_s: float, start: dict[str, str], t0: float,
               max_rounds: int | None = None, pack_s: float = 0.0, post_s: float = 0.0, start_obj: float | None = None):
    """Solve-and-pack rounds until `time_limit_s` since `t0`. The slowest packing so far (at first `pack_s`, what
    best-fit took) and `post_s` (the caller's work after this returns) are kept back from each solve for the packing
    of its answer, and a repair that would pack past that stops at the best packing so far: the limit is the
    caller's deadline. Returns (placement, bound, proven, its objective); `start_obj`: start's, if the caller has it."""
    slowest = [pack_s]

    def pack(keep):
        a = time.perf_counter()
        placement = pack_kept(state, keep, deadline=t0 + time_limit_s - post_s)
        slowest[0] = max(slowest[0], time.perf_counter() - a)
        return placement

    def reserve() -> float:
        return slowest[0] + post_s
    caps = state.caps()
    wk = {w.id: w for w in state.workers}
    need_total = sum(t.need for t in state.trajectories)
    count = len(state.trajectories)
    move_cost = {w: 0.0 for w in wk}
    rates = sorted((w.move_cost_per_token, w.id) for w in state.workers)
    for t in state.trajectories:  # cheapest destination other than its own worker: a lower bound on its cost
        r = next((r for r, w in rates if w != t.worker), 0.0)
        move_cost[t.worker] += t.context * r
    p = Problem("repack-aggregate")
    for w in state.workers:
        v = p.add_var(f"keep_{w.id}")  # 1: worker w keeps running trajectories
        # freeing w earns its value and pays its trajectories' cheapest moves: min Σ keep·(value − move)
        p.objective[v] = wk[w.id].value - move_cost[w.id]
    p.objective_constant = -sum(wk[w].value - move_cost[w] for w in wk)
    p.add_constraint("kv_cover", {f"keep_{w}": caps[w][0] for w in wk}, ">=", float(need_total))
    p.add_constraint("batch_cover", {f"keep_{w}": float(caps[w][1]) for w in wk}, ">=", float(count))
    _limit_row(p, state)
    best, best_obj = start, (evaluate(state, start).objective if start_obj is None else start_obj)
    bound = None
    hint_keep = set(start.values())
    first = True
    last = 0.0
    rounds = 0
    while time_limit_s - (time.perf_counter() - t0) > last:  # stop when another round would overrun
        if max_rounds is not None and rounds >= max_rounds:
            break
        rounds += 1
        t_it = time.perf_counter()
        left = time_limit_s - (t_it - t0) - reserve()
        if left <= 0:
            break
        hint = {f"keep_{w}": float(w in hint_keep) for w in wk}
        raw = _solve(backend, p, t0 + time_limit_s - reserve(), hint)
        if raw.values is None:
            break
        if first and raw.bound is not None and raw.bound_in_plan_units:
            bound = -raw.bound  # the relaxation's optimum bounds the full program (later cuts are heuristic)
        first = False
        keep = {w for w in wk if raw.values.get(f"keep_{w}", 0.0) > 0.5}
        if -raw.objective <= best_obj + 1e-9:
            break  # the (cut) relaxation cannot beat what we hold
        try:
            placement = pack(keep)
        except OutOfTime:
            break  # its answer would come too late: what we hold stands
        if placement is not None:
            obj = evaluate(state, placement).objective
            if obj > best_obj:
                best, best_obj = placement, obj
            break
        # repair: keep back the k freed workers worth least, for the least k (found by bisection: O(log F) packings
        # instead of F; keeping every one back always packs, as every trajectory then stays put) that packs
        freed = [w for w in wk if w not in keep]
        worth = {w: wk[w].value - move_cost[w] for w in freed}
        order = sorted(freed, key=lambda w: (worth[w], w))
        lo, hi, packed = 0, len(order), None  # pack(keep + order[:hi]) succeeds; pack(keep + order[:lo]) failed
        while hi - lo > 1:
            if time.perf_counter() - t0 + reserve() > time_limit_s:
                break  # past the deadline: what is packed so far (or best-fit) stands
            mid = (lo + hi) // 2
            try:
                placement = pack(set(keep) | set(order[:mid]))
            except OutOfTime:
                break
            if placement is None:
                lo = mid
            else:
                hi, packed = mid, placement
        if packed is None and time.perf_counter() - t0 + reserve() <= time_limit_s:
            try:
                packed = pack(set(keep) | set(order[:hi]))
            except OutOfTime:
                pass
        if packed is not None:
            obj = evaluate(state, packed).objective
            if obj > best_obj:
                best, best_obj = packed, obj
        # no-good cut: best-fit could not pack this keep set; keep at least one of its freed workers
        p.add_constraint(f"cut_{len(p.constraints)}", {f"keep_{w}": 1.0 for w in freed}, ">=", 1.0)
        last = time.perf_counter() - t_it
    proven = bound is not None and best_obj >= bound - 1e-6 * max(1.0, abs(bound))
    return best, bound, proven, best_obj
