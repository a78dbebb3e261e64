"""Exact enumeration for tiny instances: the referee every solver backend is tested against.

Groups share nothing but the objective and the indicator budget, so each group's plans are
enumerated alone (numpy over all index combinations) and then combined:

* accuracy_degradation: Σ_g share_g·ω is separable, so each group takes its least-degrading
  plan within its own bounds; the budget (if any) then holds or the instance is infeasible.
* iteration_time: minimise max_g time_g subject to Σ_g deg_g ≤ budget. For a threshold T
  each group's best contribution is its least degradation among plans with time ≤ T, and
  feasibility is monotone in T, so the optimum is the least candidate T (a plan time of
  some group) whose per-group minima fit the budget.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from qsync_opt.errors import SpecError
from qsync_opt.training.program.instance import Assignment, GroupInstance, TrainingInstance

MAX_PLANS_PER_GROUP = 200_000


@dataclass(frozen=True)
class BruteResult:
    status: str
    """"optimal" or "infeasible"."""
    objective: float | None
    assignment: Assignment | None


@dataclass(frozen=True)
class _Plans:
    """Every bound-respecting plan of one group: choice indices, time, share-weighted degradation."""

    ops: tuple[str, ...]
    allowed: tuple[tuple[str, ...], ...]
    idx: np.ndarray
    time: np.ndarray
    deg: np.ndarray

    def assignment(self, k: int) -> dict[str, str]:
        return {op: self.allowed[i][self.idx[k, i]] for i, op in enumerate(self.ops)}


def brute_force(instance: TrainingInstance) -> BruteResult:
    """The exact optimum of `instance` by enumeration (small instances only)."""
    plans = [_enumerate(instance, g) for g in instance.groups]
    if any(len(p.time) == 0 for p in plans):
        return BruteResult("infeasible", None, None)
    budget = math.inf if instance.max_degradation is None else instance.max_degradation
    if instance.objective == "accuracy_degradation":
        best = [int(np.argmin(p.deg)) for p in plans]
        total = float(sum(p.deg[k] for p, k in zip(plans, best)))
        if total > budget:
            return BruteResult("infeasible", None, None)
        return BruteResult("optimal", total, _assign(instance, plans, best))
    candidates = np.unique(np.concatenate([p.time for p in plans]))
    lo, hi, found = 0, len(candidates) - 1, None
    while lo <= hi:  # least candidate T whose per-group least degradations fit the budget
        mid = (lo + hi) // 2
        pick = _least_deg_within(plans, candidates[mid])
        if pick is not None and sum(p.deg[k] for p, k in zip(plans, pick)) <= budget:
            found, hi = (mid, pick), mid - 1
        else:
            lo = mid + 1
    if found is None:
        return BruteResult("infeasible", None, None)
    mid, pick = found
    return BruteResult("optimal", float(max(p.time[k] for p, k in zip(plans, pick))), _assign(instance, plans, pick))


def _least_deg_within(plans: list[_Plans], t: float) -> list[int] | None:
    pick = []
    for p in plans:
        ok = np.flatnonzero(p.time <= t)
        if len(ok) == 0:
            return None
        pick.append(int(ok[np.argmin(p.deg[ok])]))
    return pick


def _assign(instance: TrainingInstance, plans: list[_Plans], picks: list[int]) -> Assignment:
    return {g.name: p.assignment(k) for g, p, k in zip(instance.groups, plans, picks)}


def _enumerate(instance: TrainingInstance, g: GroupInstance) -> _Plans:
    ops = g.ops
    allowed = tuple(g.allowed[op] for op in ops)
    count = math.prod(len(a) for a in allowed)
    if count > MAX_PLANS_PER_GROUP:
        raise SpecError(
            f"groups[{g.name}]: {count} plans to enumerate (> {MAX_PLANS_PER_GROUP}); "
            "brute force is for tiny instances — use solve_instance instead"
        )
    idx = np.array(list(itertools.product(*(range(len(a)) for a in allowed))), dtype=np.int64).reshape(count, len(ops))
    pos = {op: i for i, op in enumerate(ops)}
    time = np.full(count, float(g.fixed_ms))
    mem = np.full(count, float(g.fixed_mem_bytes))
    deg = np.zeros(count)
    for i, op in enumerate(ops):
        col = idx[:, i]
        time += np.array([g.time_ms[op][p] for p in allowed[i]])[col]
        mem += np.array([g.mem_bytes[op][p] for p in allowed[i]])[col]
        deg += np.array([instance.omega[op][p] for p in allowed[i]])[col]
    time += _casts(g.cast_ms, pos, allowed, idx)
    for r in g.sync_rows:  # the group's time is its largest row (instance.group_time_ms)
        t = np.full(count, float(r.const_ms)) + _casts(r.cast_ms, pos, allowed, idx)
        for op, table in r.op_ms.items():
            i = pos[op]
            t += np.array([table.get(p, 0.0) for p in allowed[i]])[idx[:, i]]
        time = np.maximum(time, t)
    deg *= g.share
    ok = mem <= g.mem_capacity_bytes
    if g.time_bound_ms is not None:
        ok &= time <= g.time_bound_ms
    return _Plans(ops, allowed, idx[ok], time[ok], deg[ok])


def _casts(cast_ms, pos, allowed, idx) -> np.ndarray:
    total = np.zeros(len(idx))
    for (a, b), table in cast_ms.items():
        ia, ib = pos[a], pos[b]
        c = np.array([[table.get((pa, pb), 0.0) for pb in allowed[ib]] for pa in allowed[ia]])
        total += c[idx[:, ia], idx[:, ib]]
    return total
