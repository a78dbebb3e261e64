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

`repack(state)` never returns a plan worse than best-fit (it keeps best-fit when the program finds
nothing better in time).

Example (an RL framework's rollout manager, every tick)::

    from qsync_opt.rollout.repack import RepackState, RepackWorker, RepackTraj, repack

    workers = [RepackWorker("w0", kv_capacity=8000, batch_cap=8, value=500.0, move_cost_per_token=0.01),
               RepackWorker("w1", kv_capacity=8000, batch_cap=8, value=500.0, move_cost_per_token=0.01)]
    trajs = [RepackTraj("t0", worker="w0", context=900, remaining=3000),
             RepackTraj("t1", worker="w1", context=700, remaining=2500)]
    result = repack(RepackState(workers, trajs, kv_threshold=0.9))
    result.freed   # ['w0'] or ['w1']: one worker can take both tails
    result.moves   # [Move(traj='t0', src='w0', dst='w1', cost=9.0)] (or the mirror)
"""

from __future__ import annotations

import bisect
import itertools
import time
from dataclasses import dataclass, field
from typing import Literal

from qsync_opt.errors import SolverError
from qsync_opt.solver.backends import EXACT, get_backend
from qsync_opt.solver.backends.base import SolveOptions
from qsync_opt.solver.problem import Problem

FULL_LIMIT = 1500
"""Largest trajectories × workers count solved in the full form (beyond it: the aggregate form)."""


@dataclass(frozen=True)
class RepackWorker:
    id: str
    kv_capacity: float
    """KV-cache capacity in tokens."""
    batch_cap: int
    """Most trajectories it may decode together."""
    value: float
    """Value of freeing it (objective units, e.g. tokens it can generate with new weights in the time gained)."""
    move_cost_per_token: float = 0.0
    """Cost (objective units) per context token of moving a trajectory onto this worker."""


@dataclass(frozen=True)
class RepackTraj:
    id: str
    worker: str
    """The worker it runs on now."""
    context: int
    """Tokens in its KV cache so far (prompt + generated)."""
    remaining: int
    """Predicted tokens still to generate."""

    @property
    def need(self) -> int:
        return self.context + self.remaining


@dataclass(frozen=True)
class RepackState:
    workers: list[RepackWorker]
    trajectories: list[RepackTraj]
    kv_threshold: float = 0.9
    """Fraction of each worker's KV capacity a repack may fill, in (0, 1]."""
    max_freed: int | None = None
    """Most workers worth freeing (e.g. as many as the queued work can fill); None: no limit."""

    def cost(self, t: RepackTraj, w: RepackWorker) -> float:
        return 0.0 if t.worker == w.id else t.context * w.move_cost_per_token

    def caps(self) -> dict[str, tuple[float, int]]:
        """worker -> (KV tokens, trajectories) it may hold after the repack."""
        own_kv: dict[str, float] = {w.id: 0.0 for w in self.workers}
        own_n: dict[str, int] = {w.id: 0 for w in self.workers}
        for t in self.trajectories:
            own_kv[t.worker] += t.need
            own_n[t.worker] += 1
        return {w.id: (max(self.kv_threshold * w.kv_capacity, own_kv[w.id]), max(w.batch_cap, own_n[w.id]))
                for w in self.workers}


@dataclass(frozen=True)
class Move:
    traj: str
    src: str
    dst: str
    cost: float


@dataclass
class RepackResult:
    moves: list[Move]
    freed: list[str]
    """Workers left with no trajectory (free to pull new weights)."""
    objective: float
    """Σ value of freed workers − Σ migration cost."""
    bound: float | None
    """Upper bound on the objective (None: none proven)."""
    status: Literal["optimal", "feasible"]
    method: str
    wall_s: float
    backend: str | None = None
    form: str | None = None
    baseline_objective: float | None = None
    """Best-fit's objective on the same state (program only)."""
    notes: list[str] = field(default_factory=list)

    @property
    def gap(self) -> float | None:
        if self.bound is None:
            return None
        return max(0.0, self.bound - self.objective) / max(abs(self.bound), 1e-9)


def evaluate(state: RepackState, placement: dict[str, str]) -> tuple[float, list[str], list[str]]:
    """(objective, freed workers, violations) of a placement traj -> worker."""
    caps = state.caps()
    wk = {w.id: w for w in state.workers}
    rate = {w.id: w.move_cost_per_token for w in state.workers}
    kv = {w: 0.0 for w in wk}
    n = {w: 0 for w in wk}
    cost = 0.0
    for t in state.trajectories:
        d = placement[t.id]
        kv[d] += t.context + t.remaining
        n[d] += 1
        if d != t.worker:
            cost += t.context * rate[d]
    bad = [f"{w}: KV {kv[w]:.0f} > {caps[w][0]:.0f}" for w in wk if kv[w] > caps[w][0] + 1e-6]
    bad += [f"{w}: batch {n[w]} > {caps[w][1]}" for w in wk if n[w] > caps[w][1]]
    freed = [w for w in wk if n[w] == 0]
    return sum(wk[w].value for w in freed) - cost, freed, bad


def _result(state, placement, method, t0, **kw) -> RepackResult:
    obj, freed, bad = evaluate(state, placement)
    if bad:
        raise SolverError(f"repack ({method}) produced a placement that breaks the caps: {'; '.join(bad)}")
    wk = {w.id: w for w in state.workers}
    moves = [Move(t.id, t.worker, placement[t.id], state.cost(t, wk[placement[t.id]]))
             for t in state.trajectories if placement[t.id] != t.worker]
    return RepackResult(moves, freed, obj, method=method, wall_s=time.perf_counter() - t0, **kw)


class _Bins:
    """Residual KV room of open workers, grouped by move cost per token and sorted within a group, so
    that a trajectory goes to the cheapest group and, inside it, to the tightest fit (bisect: O(log W))."""

    def __init__(self, state: RepackState, open_ids, kv: dict, n: dict, caps: dict):
        self.caps, self.kv, self.n = caps, dict(kv), dict(n)
        self.rate = {w.id: w.move_cost_per_token for w in state.workers}
        self.classes: dict[float, list] = {}
        for w in open_ids:
            if self.n[w] < caps[w][1]:
                self.classes.setdefault(self.rate[w], []).append((caps[w][0] - self.kv[w], w))
        for lst in self.classes.values():
            lst.sort()
        self.order = sorted(self.classes)

    def copy(self) -> _Bins:
        c = object.__new__(_Bins)
        c.caps, c.kv, c.n, c.rate, c.order = self.caps, dict(self.kv), dict(self.n), self.rate, self.order
        c.classes = {r: list(lst) for r, lst in self.classes.items()}
        return c

    def close(self, w: str) -> None:
        lst = self.classes.get(self.rate[w])
        if lst is None:
            return
        i = bisect.bisect_left(lst, (self.caps[w][0] - self.kv[w], w))
        if i < len(lst) and lst[i][1] == w:
            lst.pop(i)

    def place(self, need: float, exclude: str | None = None) -> str | None:
        for r in self.order:
            lst = self.classes[r]
            i = bisect.bisect_left(lst, (need - 1e-9, ""))
            while i < len(lst) and lst[i][1] == exclude:
                i += 1
            if i >= len(lst):
                continue
            room, w = lst.pop(i)
            self.kv[w] += need
            self.n[w] += 1
            if self.n[w] < self.caps[w][1]:
                bisect.insort(lst, (room - need, w))
            return w
        return None


def _loads(state: RepackState):
    kv = {w.id: 0.0 for w in state.workers}
    n = {w.id: 0 for w in state.workers}
    on: dict[str, list[RepackTraj]] = {w.id: [] for w in state.workers}
    for t in state.trajectories:
        kv[t.worker] += t.need
        n[t.worker] += 1
        on[t.worker].append(t)
    return kv, n, on


def best_fit(state: RepackState) -> dict[str, str]:
    """Laminar's heuristic: try to free workers from the least loaded up; each of a candidate's
    trajectories (largest first) goes to the open worker it fits most tightly (cheapest move-cost
    group first) under the KV threshold and batch cap. A candidate is freed only if all its
    trajectories fit and its value exceeds their moving cost; a worker that received stays open."""
    caps = state.caps()
    wk = {w.id: w for w in state.workers}
    kv, n, on = _loads(state)
    placement = {t.id: t.worker for t in state.trajectories}
    freed = {w for w in wk if n[w] == 0}
    bins = _Bins(state, [w for w in wk if w not in freed], kv, n, caps)
    receivers: set[str] = set()
    limit = len(freed) + (state.max_freed if state.max_freed is not None else len(wk))
    for cand in sorted(wk, key=lambda w: (kv[w], w)):
        if len(freed) >= limit:
            break
        if cand in freed or cand in receivers:
            continue
        trial = bins.copy()
        trial.close(cand)
        moved, cost = {}, 0.0
        for t in sorted(on[cand], key=lambda t: (-t.need, t.id)):
            d = trial.place(t.need, exclude=cand)
            if d is None:
                break
            moved[t.id] = d
            cost += t.context * trial.rate[d]
        if len(moved) < len(on[cand]) or wk[cand].value - cost <= 0:
            continue
        bins = trial
        placement.update(moved)
        receivers.update(moved.values())
        for t in on[cand]:
            on[moved[t.id]].append(t)
        on[cand] = []
        freed.add(cand)
    return placement


def _pack(state: RepackState, keep: set[str]) -> dict[str, str] | None:
    """Best-fit decreasing of the freed workers' trajectories onto the kept ones; None if it fails."""
    caps = state.caps()
    kv, n, on = _loads(state)
    bins = _Bins(state, [w for w in keep], kv, n, caps)
    placement = {}
    movers = []
    for t in state.trajectories:
        if t.worker in keep:
            placement[t.id] = t.worker
        else:
            movers.append(t)
    for t in sorted(movers, key=lambda t: (-t.need, t.id)):
        d = bins.place(t.need)
        if d is None:
            return None
        placement[t.id] = d
    return placement


def _opts(time_limit_s: float, hint=None) -> SolveOptions:
    return SolveOptions(time_limit_s=max(time_limit_s, 1e-3), rel_gap=1e-6, hint=hint, threads=1)


def _limit_row(p: Problem, state: RepackState) -> None:
    """Σ (1 − keep_w) ≤ max_freed, over the workers that hold trajectories (empty ones are free anyway)."""
    if state.max_freed is None:
        return
    busy = sorted({t.worker for t in state.trajectories})
    p.add_constraint("max_freed", {f"keep_{w}": 1.0 for w in busy}, ">=", float(len(busy) - state.max_freed))


def _full(state: RepackState, backend: str, time_limit_s: float, start: dict[str, str]):
    caps = state.caps()
    p = Problem("repack-full")
    wk = {w.id: w for w in state.workers}
    total_value = sum(w.value for w in state.workers)
    for w in state.workers:
        p.add_var(f"keep_{w.id}")  # 1: worker w keeps running trajectories
        p.objective[f"keep_{w.id}"] = w.value
    for t in state.trajectories:
        names = []
        for w in state.workers:
            v = p.add_var(f"x_{t.id}_{w.id}")  # 1: trajectory t runs on worker w after the repack
            names.append(v)
            c = state.cost(t, w)
            if c:
                p.objective[v] = c
            p.add_constraint(f"on_kept_{t.id}_{w.id}", {v: 1.0, f"keep_{w.id}": -1.0}, "<=", 0.0)
        p.add_onehot(f"one_{t.id}", names)
    for w in state.workers:
        kv = {f"x_{t.id}_{w.id}": float(t.need) for t in state.trajectories}
        kv[f"keep_{w.id}"] = -caps[w.id][0]
        p.add_constraint(f"kv_{w.id}", kv, "<=", 0.0)
        nb = {f"x_{t.id}_{w.id}": 1.0 for t in state.trajectories}
        nb[f"keep_{w.id}"] = -float(caps[w.id][1])
        p.add_constraint(f"batch_{w.id}", nb, "<=", 0.0)
    p.objective_constant = -total_value
    _limit_row(p, state)
    hint = {f"keep_{w}": float(any(d == w for d in start.values())) for w in wk}
    hint.update({f"x_{t.id}_{w}": float(start[t.id] == w) for t in state.trajectories for w in wk})
    raw = get_backend(backend).solve(p, _opts(time_limit_s, hint))
    if raw.values is None:
        return None, None, raw.status
    placement = {}
    for t in state.trajectories:
        placement[t.id] = max(wk, key=lambda w: raw.values.get(f"x_{t.id}_{w}", 0.0))
    bound = -raw.bound if raw.bound is not None and raw.bound_in_plan_units else None
    return placement, bound, raw.status


def _aggregate(state: RepackState, backend: str, time_limit_s: float, start: dict[str, str], t0: float):
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
    best, best_obj = start, evaluate(state, start)[0]
    bound = None
    hint_keep = set(start.values())
    first = True
    last = 0.0
    while time_limit_s - (time.perf_counter() - t0) > last:  # stop when another round would overrun
        t_it = time.perf_counter()
        left = time_limit_s - (t_it - t0)
        hint = {f"keep_{w}": float(w in hint_keep) for w in wk}
        raw = get_backend(backend).solve(p, _opts(left, hint))
        if raw.values is None:
            break
        if first and raw.bound is not None and raw.bound_in_plan_units:
            bound = -raw.bound  # the relaxation's optimum bounds the full program (later cuts are heuristic)
        first = False
        keep = {w for w in wk if raw.values.get(f"keep_{w}", 0.0) > 0.5}
        if -raw.objective <= best_obj + 1e-9:
            break  # the (cut) relaxation cannot beat what we hold
        placement = _pack(state, keep)
        if placement is not None:
            obj = evaluate(state, placement)[0]
            if obj > best_obj:
                best, best_obj = placement, obj
            break
        # repair: keep back the freed workers worth least, one at a time, until the packing succeeds
        freed = [w for w in wk if w not in keep]
        worth = {w: wk[w].value - move_cost[w] for w in freed}
        repaired = set(keep)
        for w in sorted(freed, key=lambda w: (worth[w], w)):
            repaired.add(w)
            placement = _pack(state, repaired)
            if placement is not None:
                obj = evaluate(state, placement)[0]
                if obj > best_obj:
                    best, best_obj = placement, obj
                break
        # no-good cut: best-fit could not pack this keep set; keep at least one of its freed workers
        p.add_constraint(f"cut_{len(p.constraints)}", {f"keep_{w}": 1.0 for w in freed}, ">=", 1.0)
        last = time.perf_counter() - t_it
    proven = bound is not None and best_obj >= bound - 1e-6 * max(1.0, abs(bound))
    return best, bound, proven


def repack(state: RepackState, method: Literal["program", "best-fit"] = "program", backend: str = "highs",
           time_limit_s: float = 0.05, form: Literal["auto", "full", "aggregate"] = "auto") -> RepackResult:
    """Decide which workers keep running and where each in-flight trajectory goes.

    method 'best-fit' is Laminar's heuristic; 'program' solves the integer program above (form 'full'
    when trajectories × workers ≤ FULL_LIMIT, else 'aggregate') with best-fit as warm start, within
    `time_limit_s`, and never returns less than best-fit. Status 'optimal' only when proven.
    """
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
    if method == "best-fit":
        return _result(state, start, "best-fit", t0, bound=None, status="feasible")
    if backend not in EXACT:
        raise SolverError(f"repack: backend {backend!r} is not exact; use one of {', '.join(EXACT)}")
    base = evaluate(state, start)[0]
    if not state.trajectories:
        return _result(state, start, "program", t0, bound=base, status="optimal", backend=backend, form="none",
                       baseline_objective=base)
    use = form if form != "auto" else ("full" if len(state.trajectories) * len(ids) <= FULL_LIMIT else "aggregate")
    if use == "full":
        placement, bound, status = _full(state, backend, time_limit_s, start)
        if placement is None or evaluate(state, placement)[2] or evaluate(state, placement)[0] < base:
            placement = start
        obj = evaluate(state, placement)[0]
        # signed on the true gap (as solver.solve does): CP-SAT's own status speaks for a rounded copy
        proven = bound is not None and obj >= bound - 1e-6 * max(1.0, abs(bound))
    else:
        placement, bound, proven = _aggregate(state, backend, time_limit_s, start, t0)
        obj = evaluate(state, placement)[0]
    if bound is not None:
        bound = max(bound, obj)
    return _result(state, placement, "program", t0, bound=bound, status="optimal" if proven else "feasible",
                   backend=backend, form=use, baseline_objective=base)


def brute_force(state: RepackState) -> float:
    """The optimum by enumeration (tests and tiny states only: workers^trajectories placements)."""
    wk = [w.id for w in state.workers]
    busy = {t.worker for t in state.trajectories}
    best = evaluate(state, {t.id: t.worker for t in state.trajectories})[0]
    for combo in itertools.product(wk, repeat=len(state.trajectories)):
        placement = {t.id: d for t, d in zip(state.trajectories, combo)}
        obj, freed, bad = evaluate(state, placement)
        if state.max_freed is not None and len(set(freed) & busy) > state.max_freed:
            continue
        if not bad and obj > best:
            best = obj
    return best
