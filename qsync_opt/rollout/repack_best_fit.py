"""Best-fit repacking: Laminar's heuristic (free workers from the least loaded up, each trajectory to
its tightest-fitting open worker in the cheapest move-cost group) and the best-fit-decreasing packing
of a chosen keep set that rollout.repack_program's aggregate form uses."""

from __future__ import annotations

import bisect
import itertools
import time

from qsync_opt.rollout.repack_model import RepackState, RepackTraj


class _Bins:
    """Residual KV room of open workers, grouped by move cost per token and sorted within a group, so
    that a trajectory goes to the cheapest group and, inside it, to the tightest fit (bisect: O(log W))."""

    def __init__(self, state: RepackState, open_ids, kv: dict, n: dict, caps: dict):
        self.caps, self.kv, self.n = caps, dict(kv), dict(n)
        self.tail = state.tail if state.tail_guard else None
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
        c.caps, c.kv, c.n, c.rate, c.order, c.tail = self.caps, dict(self.kv), dict(self.n), self.rate, self.order, \
            self.tail
        c.classes = {r: list(lst) for r, lst in self.classes.items()}
        return c

    def close(self, w: str) -> None:
        lst = self.classes.get(self.rate[w])
        if lst is None:
            return
        i = bisect.bisect_left(lst, (self.caps[w][0] - self.kv[w], w))
        if i < len(lst) and lst[i][1] == w:
            lst.pop(i)

    def place(self, need: float, exclude: str | None = None, remaining: int = 0) -> str | None:
        """The open worker `need` fits most tightly (cheapest group first); under the state's tail guard only one
        whose longest remaining trajectory is at least `remaining`."""
        tail = self.tail
        for r in self.order:
            lst = self.classes[r]
            i = bisect.bisect_left(lst, (need - 1e-9, ""))
            while i < len(lst) and (lst[i][1] == exclude or (tail is not None and tail(lst[i][1]) < remaining)):
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
    """(KV held, trajectories held) per worker, computed once per state (callers copy before changing them)."""
    got = state.__dict__.get("_loads")
    if got is None:
        got = state.__dict__["_loads"] = _count_loads(state)
    return got


def _laminar_order(state: RepackState) -> list[RepackTraj]:
    """The state's trajectories in the order best_fit and pack_kept place them: worker by worker from the least loaded
    (KV held) up, each worker's largest need first (ties by id); sorted once per state."""
    got = state.__dict__.get("_laminar_order")
    if got is None:
        kv = _loads(state)[0]
        got = state.__dict__["_laminar_order"] = sorted(state.trajectories,
                                                        key=lambda t: (kv[t.worker], t.worker, -t.need, t.id))
    return got


def _count_loads(state: RepackState):
    kv = {w.id: 0.0 for w in state.workers}
    n = {w.id: 0 for w in state.workers}
    for t in state.trajectories:
        kv[t.worker] += t.need
        n[t.worker] += 1
    return kv, n


def best_fit(state: RepackState) -> dict[str, str]:
    """Laminar's heuristic: try to free workers from the least loaded up; each of a candidate's
    trajectories (largest first) goes to the open worker it fits most tightly (cheapest move-cost
    group first) under the KV threshold and batch cap. A candidate is freed only if all its
    trajectories fit and its value exceeds their moving cost; a worker that received stays open."""
    caps = state.caps()
    wk = {w.id: w for w in state.workers}
    kv, n = _loads(state)
    placement = {t.id: t.worker for t in state.trajectories}
    freed = {w for w in wk if n[w] == 0}
    bins = _Bins(state, [w for w in wk if w not in freed], kv, n, caps)
    receivers: set[str] = set()
    limit = len(freed) + (state.max_freed if state.max_freed is not None else len(wk))
    for cand, group in itertools.groupby(_laminar_order(state), key=lambda t: t.worker):
        if len(freed) >= limit:
            break
        if cand in receivers:
            continue
        ts = list(group)
        trial = bins.copy()
        trial.close(cand)
        moved, cost = {}, 0.0
        for t in ts:
            d = trial.place(t.need, exclude=cand, remaining=t.remaining)
            if d is None:
                break
            moved[t.id] = d
            cost += t.context * trial.rate[d]
        if len(moved) < len(ts) or wk[cand].value - cost <= 0:
            continue
        bins = trial
        placement.update(moved)
        receivers.update(moved.values())
        freed.add(cand)
    return placement


class OutOfTime(Exception):
    """A packing passed its deadline before it finished (its answer would come too late to use)."""


def pack_kept(state: RepackState, keep: set[str], deadline: float | None = None) -> dict[str, str] | None:
    """Best-fit's placement of the freed workers' trajectories onto the kept ones: freed worker by freed worker from
    the least loaded up, each one's largest first, to its tightest fit; None if one does not fit. So a program's plan
    differs from best-fit's only in which workers it frees (a global best-fit decreasing over all freed
    trajectories packs the same keep sets worse: docs/rollout.md). With a `deadline` (a perf_counter instant) it
    raises OutOfTime once past it: under the tail guard a packing's time varies too widely, even on one state, to be
    foreseen (docs/rollout.md)."""
    caps = state.caps()
    kv, n = _loads(state)
    bins = _Bins(state, [w for w in keep], kv, n, caps)
    placement = {}
    placed = 0
    for t in _laminar_order(state):
        if t.worker in keep:
            placement[t.id] = t.worker
            continue
        if deadline is not None and placed % 64 == 0 and time.perf_counter() > deadline:
            raise OutOfTime
        placed += 1
        d = bins.place(t.need, remaining=t.remaining)
        if d is None:
            return None
        placement[t.id] = d
    return placement
