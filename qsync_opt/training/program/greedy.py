"""QSync's greedy allocator on a TrainingInstance: a fast plan, no optimality guarantee.

accuracy_degradation (QSync's allocator, per group):
  * a group with a time bound starts every op at its *fastest* allowed precision (lowest is
    not always fastest; ties go to the lower precision); a group without one starts at its
    highest allowed precision;
  * if memory is over capacity, ops are lowered step by step, least indicator loss per byte
    saved first, while the time bound holds;
  * then precision is raised step by step: a step that adds no time first (largest gain),
    otherwise the best gain per unit of added time (gain = Δω·share), keeping a step only
    if the exact group time (casts included) and memory still fit.
  Candidate steps sit in a lazy max-heap; a change invalidates the steps of the op and of
  its cast neighbours, whose time deltas it changes.

iteration_time: start as above from the fastest plan, then, while the share-weighted
indicator exceeds the budget, take the step with the smallest increase of the iteration
time (slowest group) per unit of indicator gain; each group offers its best step by
added group time per gain, and the group whose step raises the iteration time least per
gain wins.

The result is infeasible when even the start breaks a time bound or memory cannot be
brought under capacity; that is the heuristic giving up, not a proof (solve.diagnose is).

With a `deadline` (time.perf_counter() seconds) the raising phase stops when it passes: every
plan along the way keeps the bounds, so a cut run is still a plan, only a worse one. A solve
uses this to keep its warm start inside the time limit (QSync's allocator in Python takes
seconds per group at 5,000 ops).
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from dataclasses import dataclass

from qsync_opt.precision import BITS, rank
from qsync_opt.training.program.instance import Assignment, GroupInstance, TrainingInstance, group_mem_bytes, main_row_ms, row_ms


@dataclass(frozen=True)
class GreedyResult:
    assignment: Assignment | None
    feasible: bool
    reason: str = ""
    steps: int = 0
    complete: bool = True
    """False when the deadline cut the raising phase short."""


def greedy(instance: TrainingInstance, deadline: float | None = None) -> GreedyResult:
    """A plan for `instance` by QSync's greedy rules (see the module docstring)."""
    late = (lambda: False) if deadline is None else (lambda: time.perf_counter() > deadline)
    states = []
    for g in instance.groups:
        bounded = g.time_bound_ms is not None or instance.objective == "iteration_time"
        start = {op: (_fastest(g, op) if bounded else min(ps, key=rank)) for op, ps in g.allowed.items()}
        st = _GroupState(instance, g, start)
        if g.time_bound_ms is not None and st.time > g.time_bound_ms:
            return GreedyResult(None, False, f"{g.name}: fastest start takes {st.time:.4g} ms > bound {g.time_bound_ms:.4g} ms")
        if st.mem > g.mem_capacity_bytes and not st.shrink_to_capacity():
            return GreedyResult(None, False, f"{g.name}: memory {st.mem:.4g} B cannot be brought under {g.mem_capacity_bytes:.4g} B")
        states.append(st)
    budget = math.inf if instance.max_degradation is None else instance.max_degradation
    if instance.objective == "accuracy_degradation":
        for st in states:
            st.raise_while_it_fits(late)
    else:
        _buy_back_accuracy(states, budget, late)
    plan = {st.g.name: dict(st.choice) for st in states}
    steps = sum(st.steps for st in states)
    deg = sum(st.deg for st in states)
    cut = late()
    if deg > budget * (1 + 1e-9):
        return GreedyResult(plan, False, f"indicator {deg:.6g} stays above budget {budget:.6g}"
                            + (" (stopped at the deadline)" if cut else ""), steps, not cut)
    return GreedyResult(plan, True, "stopped at the deadline" if cut else "", steps, not cut)


def _fastest(g: GroupInstance, op: str) -> str:
    return min(g.allowed[op], key=lambda p: (g.time_ms[op][p], -rank(p), BITS[p]))


class _GroupState:
    """One group's current plan with exact incremental time, memory and indicator."""

    def __init__(self, instance: TrainingInstance, g: GroupInstance, choice: dict[str, str]):
        self.g, self.omega, self.choice = g, instance.omega, dict(choice)
        self.bound = math.inf if g.time_bound_ms is None else g.time_bound_ms
        self.main, self.mem = main_row_ms(g, choice), group_mem_bytes(g, choice)
        self.rows = [row_ms(r, choice) for r in g.sync_rows]  # the lockstep's other terms, kept exact too
        self.time = max([self.main, *self.rows])
        self.deg = g.share * sum(self.omega[op][p] for op, p in choice.items())
        self.nbrs = _neighbours(g.allowed, g.cast_ms)
        self.row_nbrs = [_neighbours(g.allowed, r.cast_ms) for r in g.sync_rows]
        self.version = dict.fromkeys(g.allowed, 0)
        self.order = {op: i for i, op in enumerate(g.allowed)}
        self.steps = 0
        self._seq = itertools.count()

    def _row_deltas(self, op: str, q: str) -> tuple[float, list[float]]:
        g, p = self.g, self.choice[op]
        d_main = g.time_ms[op][q] - g.time_ms[op][p] + self._cast_delta(self.nbrs, op, p, q)
        d_rows = []
        for r, nbrs in zip(g.sync_rows, self.row_nbrs):
            t = r.op_ms.get(op, {})
            d_rows.append(t.get(q, 0.0) - t.get(p, 0.0) + self._cast_delta(nbrs, op, p, q))
        return d_main, d_rows

    def _cast_delta(self, nbrs, op: str, p: str, q: str) -> float:
        dt = 0.0
        for other, table, op_is_a in nbrs[op]:
            if other == op:
                dt += table.get((q, q), 0.0) - table.get((p, p), 0.0)
                continue
            o = self.choice[other]
            new, old = ((q, o), (p, o)) if op_is_a else ((o, q), (o, p))
            dt += table.get(new, 0.0) - table.get(old, 0.0)
        return dt

    def delta(self, op: str, q: str) -> tuple[float, float, float]:
        """(Δtime, Δmemory, Δindicator·share) of moving `op` to precision `q`; time is the largest row."""
        g, p = self.g, self.choice[op]
        d_main, d_rows = self._row_deltas(op, q)
        after = max([self.main + d_main, *(t + d for t, d in zip(self.rows, d_rows))])
        return after - self.time, g.mem_bytes[op][q] - g.mem_bytes[op][p], g.share * (self.omega[op][q] - self.omega[op][p])

    def apply(self, op: str, q: str) -> None:
        _, dm, dd = self.delta(op, q)
        d_main, d_rows = self._row_deltas(op, q)
        self.choice[op] = q
        self.main += d_main
        self.rows = [t + d for t, d in zip(self.rows, d_rows)]
        self.time, self.mem, self.deg = max([self.main, *self.rows]), self.mem + dm, self.deg + dd
        self.steps += 1
        for nbrs in (self.nbrs, *self.row_nbrs):
            for o in [op, *(n for n, _, _ in nbrs[op])]:
                self.version[o] += 1

    def fits(self, dt: float, dm: float) -> bool:
        return self.time + dt <= self.bound and self.mem + dm <= self.g.mem_capacity_bytes

    # ---- heaps of candidate steps -------------------------------------------------------
    def _push(self, heap, op, key_fn):
        for q in self.g.allowed[op]:
            if q != self.choice[op]:
                key = key_fn(*self.delta(op, q))
                if key is not None:
                    heapq.heappush(heap, (key, self.order[op], rank(q), next(self._seq), op, q, self.version[op]))

    def _pop(self, heap, parked):
        """Best still-valid step that fits; steps that do not fit now wait in `parked`."""
        while heap:
            entry = heapq.heappop(heap)
            op, q, ver = entry[-3:]
            if ver != self.version[op]:
                continue
            dt, dm, _ = self.delta(op, q)
            if self.fits(dt, dm):
                return entry
            parked.append(entry)
        return None

    def _run(self, key_fn, stop=lambda: False) -> None:
        if stop():  # before the set-up, which alone is seconds at 5,000 ops
            return
        heap, parked = [], []
        for op in self.g.allowed:
            self._push(heap, op, key_fn)
        while not stop():
            entry = self._pop(heap, parked)
            if entry is None:
                return
            op, q = entry[-3], entry[-2]
            dt, dm, _ = self.delta(op, q)
            self.apply(op, q)
            for o in [op, *(n for n, _, _ in self.nbrs[op])]:
                self._push(heap, o, key_fn)
            if dt < 0 or dm < 0:  # room freed: parked steps may fit now
                for e in parked:
                    heapq.heappush(heap, e)
                parked.clear()

    def raise_while_it_fits(self, stop=lambda: False) -> None:
        self._run(_gain_per_time, stop)

    def shrink_to_capacity(self) -> bool:
        cap = self.g.mem_capacity_bytes
        self._run(lambda dt, dm, dd: None if dm >= 0 else (dd / -dm, dt), stop=lambda: self.mem <= cap)
        return self.mem <= cap


def _neighbours(allowed, cast_ms) -> dict[str, list[tuple[str, dict, bool]]]:
    """op -> (other end, cast table, op is the edge's source) for every edge at op."""
    nbrs: dict[str, list[tuple[str, dict, bool]]] = {op: [] for op in allowed}
    for (a, b), table in cast_ms.items():
        nbrs[a].append((b, table, True))
        if b != a:
            nbrs[b].append((a, table, False))
    return nbrs


def _gain_per_time(dt: float, dm: float, dd: float):
    """Heap key of a step that lowers the indicator: time-free steps first, then gain/time."""
    gain = -dd
    if gain <= 0:
        return None
    return (0, -gain) if dt <= 0 else (1, dt / gain)


def _buy_back_accuracy(states: list[_GroupState], budget: float, stop=lambda: False) -> None:
    heaps = [[] for _ in states]
    parked = [[] for _ in states]
    for st, h in zip(states, heaps):
        for op in st.g.allowed:
            st._push(h, op, _gain_per_time)
    while sum(st.deg for st in states) > budget and not stop():
        tops = [(i, st._pop(heaps[i], parked[i])) for i, st in enumerate(states)]
        tops = [(i, e) for i, e in tops if e is not None]
        if not tops:
            return
        now = max(st.time for st in states)

        def cost(item):
            i, e = item
            st = states[i]
            dt, _, dd = st.delta(e[-3], e[-2])
            others = max((s.time for j, s in enumerate(states) if j != i), default=0.0)
            return (max(others, st.time + dt) - now) / -dd, dt / -dd

        best = min(tops, key=cost)
        for item in tops:
            if item is not best:
                heapq.heappush(heaps[item[0]], item[1])
        i, e = best
        st, op, q = states[i], e[-3], e[-2]
        dt, dm, _ = st.delta(op, q)
        st.apply(op, q)
        for o in [op, *(n for n, _, _ in st.nbrs[op])]:
            st._push(heaps[i], o, _gain_per_time)
        if dt < 0 or dm < 0:
            for en in parked[i]:
                heapq.heappush(heaps[i], en)
            parked[i].clear()
