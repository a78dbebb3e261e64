"""QSync's own allocator (IPDPS'24), as the paper ships it: the baseline the integer program must beat.

  1. Every op of a group with a time bound (an inference group) starts at FP16; a group
     without FP16 starts at its fastest 16-bit float (BF16), else at its fastest allowed
     precision. Groups without a bound stay at their highest allowed precision.
  2. target = the synchronised iteration time of that start (the slowest group's time).
  3. A max-heap holds, per op, the indicator gain of raising it ONE step up its group's
     ladder of allowed precisions (e.g. int8 -> fp16 -> fp32), weighted by the group's share.
  4. Pop the largest gain and raise the op; keep the raise if memory fits and the
     synchronised time does not exceed the target, otherwise undo it; a kept raise pushes
     that op's next step. Repeat until the heap is empty.

This differs from `greedy.py` ("greedy (gain per ms)"), which starts from the fastest
precision, ranks steps by gain per unit of added time and may jump several steps.
`sync_time` defaults to the instance's linear group times; the pipeline passes the
replayer's timeline, as QSync does. No optimality guarantee.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

from qsync_opt.solver.instance import Assignment, GroupInstance, TrainingInstance, group_mem_bytes, group_time_ms

START = ("fp16", "bf16")
"""QSync's start, in order of preference: the 'fastest safe' half-precision float."""


def start_precision(g: GroupInstance, op: str) -> str:
    """FP16 where allowed, else BF16, else the op's fastest allowed precision."""
    allowed = g.allowed[op]
    for p in START:
        if p in allowed:
            return p
    return min(allowed, key=lambda p: (g.time_ms[op][p], allowed.index(p)))


def linear_sync_time(instance: TrainingInstance) -> Callable[[Assignment], float]:
    return lambda a: max(group_time_ms(g, a[g.name]) for g in instance.groups)


def qsync_greedy(instance: TrainingInstance, sync_time: Callable[[Assignment], float] | None = None) -> Assignment:
    """QSync's allocator on `instance` (see the module docstring); returns the assignment it ends with."""
    sync = sync_time or linear_sync_time(instance)
    plan: Assignment = {}
    for g in instance.groups:
        bounded = g.time_bound_ms is not None
        plan[g.name] = {op: (start_precision(g, op) if bounded else ps[0]) for op, ps in g.allowed.items()}
    target = sync(plan)
    heap: list[tuple[float, int, str, str]] = []
    order = 0
    for gi, g in enumerate(instance.groups):
        if g.time_bound_ms is None:
            continue
        for op in g.allowed:
            order = _push(heap, instance, g, gi, op, plan[g.name][op], order)
    while heap:
        _, _, gname, op = heapq.heappop(heap)
        gi = next(i for i, g in enumerate(instance.groups) if g.name == gname)
        g = instance.groups[gi]
        cur = plan[gname][op]
        up = _one_step_up(g, op, cur)
        plan[gname][op] = up
        if group_mem_bytes(g, plan[gname]) <= g.mem_capacity_bytes and sync(plan) <= target * (1 + 1e-9):
            order = _push(heap, instance, g, gi, op, up, order)
        else:
            plan[gname][op] = cur
    return plan


def _one_step_up(g: GroupInstance, op: str, p: str) -> str | None:
    ladder = g.allowed[op]  # highest first
    i = ladder.index(p)
    return ladder[i - 1] if i > 0 else None


def _push(heap, instance, g, gi, op, p, order) -> int:
    up = _one_step_up(g, op, p)
    if up is not None:
        gain = g.share * (instance.omega[op][p] - instance.omega[op][up])
        heapq.heappush(heap, (-gain, order, g.name, op))
    return order + 1
