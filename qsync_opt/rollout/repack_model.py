"""The repack model: workers, in-flight trajectories, the state of one tick, the moves and result,
and the objective (`evaluate`: Σ value of freed workers − Σ migration cost, with the caps it breaks),
plus `brute_force`, the optimum by enumeration that the heuristic and the program are tested against.
See rollout.repack for the program and the entry point."""

from __future__ import annotations

import functools
import itertools
import time
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

from qsync_opt.errors import SolverError


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
    tail_guard: bool = False
    """True: a trajectory may move only onto a worker whose own longest remaining trajectory is at least as long,
    so no receiver drains later than it would have (the objective prices a freed worker's drain, not a
    receiver's longer one)."""

    def allowed(self, t: RepackTraj, w: str) -> bool:
        """May t end on worker w (its own worker always; another under `tail_guard` only if w's tail is longer)."""
        return t.worker == w or not self.tail_guard or t.remaining <= self.tail(w)

    def tail(self, w: str) -> int:
        """The longest remaining trajectory worker w holds now (0 if none)."""
        return self._tails.get(w, 0)

    @functools.cached_property
    def _tails(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for t in self.trajectories:
            out[t.worker] = max(out.get(t.worker, 0), t.remaining)
        return out

    def cost(self, t: RepackTraj, w: RepackWorker) -> float:
        return 0.0 if t.worker == w.id else t.context * w.move_cost_per_token

    def caps(self) -> dict[str, tuple[float, int]]:
        """worker -> (KV tokens, trajectories) it may hold after the repack (computed once per state: a state is
        one tick's snapshot, not to be changed in place)."""
        return self._caps

    @functools.cached_property
    def _caps(self) -> dict[str, tuple[float, int]]:
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


class Evaluation(NamedTuple):
    """A placement's worth (`evaluate`)."""

    objective: float
    """Σ value of freed workers − Σ migration cost."""
    freed: list[str]
    """Workers left with no trajectory."""
    violations: list[str]
    """Each cap or tail guard the placement breaks, in words (empty: feasible)."""


def evaluate(state: RepackState, placement: dict[str, str]) -> Evaluation:
    """The objective, freed workers and violations of a placement traj -> worker."""
    caps = state.caps()
    wk = {w.id: w for w in state.workers}
    rate = {w.id: w.move_cost_per_token for w in state.workers}
    kv = {w: 0.0 for w in wk}
    n = {w: 0 for w in wk}
    cost = 0.0
    bad: list[str] = []
    for t in state.trajectories:
        d = placement[t.id]
        kv[d] += t.context + t.remaining
        n[d] += 1
        if d != t.worker:
            cost += t.context * rate[d]
            if state.tail_guard and t.remaining > state.tail(d):
                bad.append(f"{t.id}: {t.remaining} remaining onto {d}, whose longest is {state.tail(d)} (tail guard)")
    bad += [f"{w}: KV {kv[w]:.0f} > {caps[w][0]:.0f}" for w in wk if kv[w] > caps[w][0] + 1e-6]
    bad += [f"{w}: batch {n[w]} > {caps[w][1]}" for w in wk if n[w] > caps[w][1]]
    freed = [w for w in wk if n[w] == 0]
    return Evaluation(sum(wk[w].value for w in freed) - cost, freed, bad)


def repack_result(state, placement, method, t0, **kw) -> RepackResult:
    obj, freed, bad = evaluate(state, placement)
    if bad:
        raise SolverError(f"repack ({method}) produced a placement that breaks the caps: {'; '.join(bad)}")
    wk = {w.id: w for w in state.workers}
    moves = [Move(t.id, t.worker, placement[t.id], state.cost(t, wk[placement[t.id]]))
             for t in state.trajectories if placement[t.id] != t.worker]
    return RepackResult(moves, freed, obj, method=method, wall_s=time.perf_counter() - t0, **kw)


def brute_force(state: RepackState) -> float:
    """The optimum by enumeration (tests and tiny states only: workers^trajectories placements)."""
    wk = [w.id for w in state.workers]
    busy = {t.worker for t in state.trajectories}
    best = evaluate(state, {t.id: t.worker for t in state.trajectories}).objective
    for combo in itertools.product(wk, repeat=len(state.trajectories)):
        placement = {t.id: d for t, d in zip(state.trajectories, combo)}
        obj, freed, bad = evaluate(state, placement)
        if state.max_freed is not None and len(set(freed) & busy) > state.max_freed:
            continue
        if not bad and obj > best:
            best = obj
    return best
