"""Random TrainingInstances: tiny ones for brute-force checks, synthetic large ones for benchmarks.

Costs follow the shape of real ones (lower precision usually faster, sometimes not; memory
in proportion to bits; casts on neighbour edges only when precisions differ; indicators
growing as precision drops) without claiming to be any real model. Everything is a pure
function of its arguments and `seed`.
"""

from __future__ import annotations

import math
import random
from dataclasses import replace

from qsync_opt.errors import SpecError
from qsync_opt.precision import BITS, sort_high_to_low
from qsync_opt.training.program.instance import GroupInstance, TimeRow, TrainingInstance, group_mem_bytes, group_time_ms

POOL = ("fp32", "fp16", "bf16", "int8", "fp8_e4m3", "int4", "tf32", "fp8_e5m2")
#: Typical time relative to fp32 (before noise) and indicator factor relative to fp16.
REL_TIME = {"fp32": 1.0, "tf32": 0.7, "fp16": 0.5, "bf16": 0.5, "fp8_e4m3": 0.33, "fp8_e5m2": 0.33, "int8": 0.36, "int4": 0.25}
REL_OMEGA = {"fp32": 0.0, "tf32": 0.3, "fp16": 1.0, "bf16": 4.0, "fp8_e4m3": 12.0, "fp8_e5m2": 20.0, "int8": 10.0, "int4": 120.0}
_NAMES = ("conv1", "conv2", "fc", "attn.proj")


def random_small(
    seed: int,
    n_ops: int | None = None,
    n_precisions: int = 3,
    n_groups: int = 2,
    objective: str | None = None,
) -> TrainingInstance:
    """A tiny instance (≤ 8 ops) with cast edges, time and memory bounds that may bind or fail."""
    rng = random.Random(seed)
    n_ops = n_ops if n_ops is not None else rng.randint(2, 8)
    precisions = sort_high_to_low(rng.sample(POOL[:6], n_precisions))
    ops = [f"blk{i // 2}.{_NAMES[i % len(_NAMES)]}" for i in range(n_ops)]
    edges = [(ops[i], ops[i + 1]) for i in range(n_ops - 1)]
    edges += [(ops[i], ops[j]) for i in range(n_ops) for j in range(i + 2, n_ops) if rng.random() < 0.15]
    omega = _omega(rng, ops, precisions)
    objective = objective or rng.choice(["accuracy_degradation"] * 2 + ["iteration_time"])
    groups = []
    for k in range(n_groups):
        allowed = {}
        for op in ops:
            r = rng.random()
            sub = precisions if r < 0.75 else tuple(p for p in precisions if rng.random() < 0.5) or (rng.choice(precisions),)
            allowed[op] = sort_high_to_low(sub)
        g = _group(rng, f"g{k}" if k else "a100", ops, allowed, edges, speed=1.0 + 1.5 * k, negative_casts=0.05)
        lo_t, hi_t = _span(g, group_time_ms)
        lo_m, hi_m = _span(g, group_mem_bytes)
        bound = lo_t + rng.uniform(-0.15, 1.0) * (hi_t - lo_t) if (k or rng.random() < 0.5) else None
        cap = lo_m + rng.uniform(-0.1, 1.2) * (hi_m - lo_m) if rng.random() < 0.8 else math.inf
        groups.append(replace(g, time_bound_ms=bound, mem_capacity_bytes=cap, share=rng.uniform(0.2, 1.0)))
    budget = None
    worst = sum(g.share * max(omega[op][p] for p in g.allowed[op]) for g in groups for op in ops)
    if objective == "iteration_time" and rng.random() < 0.8 or rng.random() < 0.1:
        budget = rng.uniform(0.0, 0.8) * worst
    return TrainingInstance(groups=tuple(groups), omega=omega, objective=objective, max_degradation=budget)


def synthetic(
    n_ops: int,
    n_precisions: int = 5,
    n_groups: int = 4,
    kind: str = "chain",
    seed: int = 0,
    objective: str = "accuracy_degradation",
) -> TrainingInstance:
    """A feasible benchmark instance: `n_ops` selectable ops per group, all groups bounded.

    kind="chain": edges (i, i+1). kind="dag": also skip edges (i, j) for j ≤ i+4 (residual
    and attention-like fan-out). Each group's time bound lies between its fastest plan
    (per-op fastest precision, casts included) and its all-highest-precision plan, so the
    bound binds and the instance is always feasible; memory capacity admits the fastest plan.
    """
    if kind not in ("chain", "dag"):
        raise SpecError(f"kind: {kind!r} is unknown; use 'chain' or 'dag'")
    if not 1 <= n_precisions <= len(POOL):
        raise SpecError(f"n_precisions: {n_precisions}; use 1..{len(POOL)}")
    if n_ops < 1 or n_groups < 1:
        raise SpecError(f"n_ops={n_ops}, n_groups={n_groups}: both must be ≥ 1")
    rng = random.Random(seed)
    precisions = sort_high_to_low(POOL[:n_precisions])
    ops = [f"layers.{i // 4}.{_NAMES[i % 4]}" for i in range(n_ops)]
    edges = [(ops[i], ops[i + 1]) for i in range(n_ops - 1)]
    if kind == "dag":
        edges += [(ops[i], ops[j]) for i in range(n_ops) for j in range(i + 2, min(n_ops, i + 5)) if rng.random() < 0.3]
    omega = _omega(rng, ops, precisions)
    groups = []
    for k in range(n_groups):
        allowed = {op: precisions for op in ops}
        g = _group(rng, f"gpu{k}", ops, allowed, edges, speed=1.0 + 0.7 * k, negative_casts=0.0)
        fast = {op: min(g.allowed[op], key=lambda p: (g.time_ms[op][p], -BITS[p])) for op in ops}
        high = {op: g.allowed[op][0] for op in ops}
        t_fast, t_high = group_time_ms(g, fast), group_time_ms(g, high)
        bound = t_fast + rng.uniform(0.25, 0.6) * max(0.0, t_high - t_fast)
        m_fast, m_high = group_mem_bytes(g, fast), group_mem_bytes(g, high)
        cap = max(m_fast, m_fast + rng.uniform(0.3, 0.9) * (m_high - m_fast)) * (1 + 1e-9)
        groups.append(replace(g, time_bound_ms=bound, mem_capacity_bytes=cap, share=1.0 / n_groups))
    budget = None
    if objective == "iteration_time":
        worst = sum(g.share * omega[op][precisions[-1]] for g in groups for op in ops)
        budget = 0.3 * worst
    return TrainingInstance(groups=tuple(groups), omega=omega, objective=objective, max_degradation=budget)


def _omega(rng, ops, precisions):
    omega = {}
    for i, op in enumerate(ops):
        sens = math.exp(rng.gauss(0, 1.0)) * (1 + 2 * (i == 0 or i == len(ops) - 1)) * 1e-3
        omega[op] = {p: sens * REL_OMEGA[p] * rng.uniform(0.6, 1.4) for p in precisions}
    return omega


def _group(rng, name, ops, allowed, edges, speed, negative_casts):
    size = {op: math.exp(rng.gauss(0, 0.8)) for op in ops}
    time_ms, mem = {}, {}
    for op in ops:
        time_ms[op] = {}
        for p in allowed[op]:
            rel = REL_TIME[p] * rng.uniform(0.8, 1.25) * (2.2 if rng.random() < 0.08 else 1.0)
            time_ms[op][p] = size[op] * speed * rel
        mem[op] = {p: size[op] * 2**26 * BITS[p] / 32 * rng.uniform(0.9, 1.1) for p in allowed[op]}
    casts = {}
    for a, b in edges:
        table = {}
        n = 0.02 * min(size[a], size[b]) * speed
        for pa in allowed[a]:
            for pb in allowed[b]:
                if pa != pb and rng.random() < 0.9:
                    c = n * rng.uniform(0.5, 2.0) * (1 + (pa in ("int8", "int4")) + (pb in ("int8", "int4")))
                    table[pa, pb] = -0.3 * c if rng.random() < negative_casts else c
        casts[a, b] = table
    return GroupInstance(
        name=name,
        share=1.0,
        allowed=dict(allowed),
        time_ms=time_ms,
        mem_bytes=mem,
        cast_ms=casts,
        fixed_ms=sum(size.values()) * speed * 0.1,
        fixed_mem_bytes=sum(size.values()) * 2**26,
    )


def _span(g: GroupInstance, fn):
    """Rough (min, max) of fn over plans: per-op extremes, casts ignored."""
    lo = fn(g, {op: min(ps, key=lambda p: _val(g, fn, op, p)) for op, ps in g.allowed.items()})
    hi = fn(g, {op: max(ps, key=lambda p: _val(g, fn, op, p)) for op, ps in g.allowed.items()})
    return min(lo, hi), max(lo, hi)


def _val(g, fn, op, p):
    return g.time_ms[op][p] if fn is group_time_ms else g.mem_bytes[op][p]


def with_sync_rows(instance: TrainingInstance, seed: int, n_rows: int = 2) -> TrainingInstance:
    """`instance` with lockstep-like sync rows per group (instance.TimeRow), bounds redrawn to bind.

    Row k has the shape of a bucket term (predictor/lockstep.py): each op's forward part (a
    random share of its time) always, its backward part only for ops from a cut point on, the
    casts likewise, plus an all-reduce tail that shrinks with k. Each group's time bound is
    redrawn between its fastest and slowest plan by the new group time (the largest row)."""
    rng = random.Random(seed)
    groups = []
    for g in instance.groups:
        ops = list(g.allowed)
        fwd = {op: rng.uniform(0.25, 0.5) for op in ops}
        cuts = sorted(rng.randrange(len(ops)) for _ in range(n_rows))
        base = g.fixed_ms
        rows = []
        for k, cut in enumerate(cuts):
            on = {op: i >= cut for i, op in enumerate(ops)}
            op_ms = {op: {p: t * (fwd[op] + (1 - fwd[op]) * on[op]) for p, t in g.time_ms[op].items()} for op in ops}
            cast_ms = {(a, b): {pair: c * (0.5 + 0.5 * on[b]) for pair, c in table.items()}
                       for (a, b), table in g.cast_ms.items()}
            tail = base * rng.uniform(0.5, 3.0) * (n_rows - k) / n_rows
            rows.append(TimeRow(name=f"bucket {k}", op_ms=op_ms, cast_ms=cast_ms, const_ms=tail))
        g2 = replace(g, sync_rows=tuple(rows))
        if g.time_bound_ms is not None:
            lo_t, hi_t = _span(g2, group_time_ms)
            g2 = replace(g2, time_bound_ms=lo_t + rng.uniform(-0.1, 1.0) * (hi_t - lo_t))
        groups.append(g2)
    return replace(instance, groups=tuple(groups))
