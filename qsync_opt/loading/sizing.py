"""How many loader workers each source gets, so that no source starves the mix.

Source s needs d_s = peak share of s over the weight schedule × samples/s the trainer
consumes; one of its workers supplies 1 / p_s samples/s (p_s: measured CPU-seconds to read
and preprocess one sample). With n_s workers its supply ratio is n_s / (p_s·d_s). The
program maximises the smallest ratio z over the sources, under a CPU budget (one CPU per
worker), optionally a memory budget (m_s per worker) and a per-source cap (e.g. shards):

    max z  s.t.  n_s − p_s·d_s·z ≥ 0,  Σ n_s ≤ cpus,  Σ m_s·n_s ≤ memory,  lo_s ≤ n_s ≤ hi_s (integer)

then, at that z (or at z = 1 when the budget allows keeping up), the fewest workers. z ≥ 1:
every source keeps up; z < 1: the slowest source supplies only z of what the mix takes and
the step waits for it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

from qsync_opt.data.sources import piecewise
from qsync_opt.errors import InfeasibleError, SpecError
from qsync_opt.solver.backends import get_backend
from qsync_opt.solver.backends.base import SolveOptions
from qsync_opt.solver.problem import Problem


@dataclass
class Sizing:
    workers: dict[str, int]
    supply_ratio: float
    """min over sources of supply / demand at these worker counts (≥ 1: no source starves)."""
    status: str
    demand: dict[str, float]

    def report(self) -> str:
        parts = ", ".join(f"{k}: {v}" for k, v in self.workers.items())
        verdict = "every source keeps up" if self.supply_ratio >= 1 else \
            f"the slowest source supplies {self.supply_ratio:.0%} of its demand"
        return f"loader workers {parts} ({verdict}; {self.status})"


def peak_shares(schedules: Sequence[Sequence[tuple[int, float]]]) -> list[float]:
    """Each source's largest normalised weight over the schedule breakpoints (shares are
    piecewise linear fractions between breakpoints, so the extremes are at breakpoints)."""
    steps = sorted({int(s) for sch in schedules for s, _ in sch})
    peak = [0.0] * len(schedules)
    for t in steps:
        w = [piecewise(list(sch), t) for sch in schedules]
        total = sum(w)
        if total > 0:
            peak = [max(p, x / total) for p, x in zip(peak, w)]
    return peak


def size_loaders(names: Sequence[str], cost_s: Sequence[float], shares: Sequence[float], samples_per_s: float,
                 cpus: int, *, mem_per_worker: Sequence[float] | None = None, memory: float | None = None,
                 max_workers: Sequence[int] | None = None, backend: str = "highs", time_limit_s: float = 5.0) -> Sizing:
    k = len(names)
    if not (len(cost_s) == len(shares) == k) or k == 0:
        raise SpecError("loader sizing: give one preprocessing cost and one share per source")
    if any(not (c >= 0) for c in cost_s) or any(not (s >= 0) for s in shares) or not samples_per_s > 0:
        raise SpecError("loader sizing: costs and shares must be >= 0 and the sample rate > 0")
    if not (isinstance(cpus, int) and cpus >= 1):
        raise SpecError(f"loader sizing: the CPU budget must be a positive integer, got {cpus!r}")
    demand = [samples_per_s * s for s in shares]
    need = [p * d for p, d in zip(cost_s, demand)]  # workers to keep up exactly
    lo = [1 if d > 0 else 0 for d in demand]
    hi = [int(m) for m in max_workers] if max_workers is not None else [cpus] * k
    if sum(lo) > cpus:
        raise InfeasibleError(f"loader sizing: {sum(lo)} sources need a worker each but the CPU budget is {cpus}",
                              ["raise the CPU budget or drop a source"])

    def program(z_fixed: float | None):
        p = Problem("loader_sizing")
        n = [p.add_var(f"n_{i}", "integer", lb=lo[i], ub=hi[i]) for i in range(k)]
        p.add_constraint("cpus", {v: 1.0 for v in n}, "<=", float(cpus))
        if memory is not None and mem_per_worker is not None:
            p.add_constraint("memory", {v: float(m) for v, m in zip(n, mem_per_worker)}, "<=", float(memory))
        if z_fixed is None:
            z = p.add_var("z", "continuous", lb=0.0, ub=float(cpus) / max(min((x for x in need if x > 0), default=1.0), 1e-12))
            for i in range(k):
                if need[i] > 0:
                    p.add_constraint(f"supply_{i}", {n[i]: 1.0, z: -need[i]}, ">=", 0.0)
            p.objective = {z: -1.0}
        else:
            for i in range(k):
                if need[i] > 0:
                    p.add_constraint(f"supply_{i}", {n[i]: 1.0}, ">=", math.floor(need[i] * z_fixed * (1 + 1e-12) * 1e9) / 1e9)
            p.objective = {v: 1.0 for v in n}
        return p, n

    t0 = time.perf_counter()
    be = get_backend(backend)
    p, n = program(None)
    r = be.solve(p, SolveOptions(time_limit_s=time_limit_s, rel_gap=0.0, threads=1))
    if r.values is None:
        raise InfeasibleError(f"loader sizing: no worker counts fit the budgets ({r.status})",
                              [f"cpus {cpus}, memory {memory}", "raise the budgets"])
    z_best = min((r.values[n[i]] / need[i] for i in range(k) if need[i] > 0), default=math.inf)
    target = min(z_best, 1.0) if math.isfinite(z_best) else 0.0
    p2, n2 = program(target)
    left = max(0.1, time_limit_s - (time.perf_counter() - t0))
    r2 = be.solve(p2, SolveOptions(time_limit_s=left, rel_gap=0.0, threads=1))
    values = r2.values if r2.values is not None else r.values
    names_n = n2 if r2.values is not None else n
    workers = {name: int(round(values[v])) for name, v in zip(names, names_n)}
    ratio = min((workers[names[i]] / need[i] for i in range(k) if need[i] > 0), default=math.inf)
    status = "optimal" if r.status == "optimal" and r2.status == "optimal" else "feasible"
    return Sizing(workers, ratio, status, dict(zip(names, demand)))


def measure_cost(source, n: int = 32) -> float:
    """Median CPU-seconds to read one sample of `source` (a loading.sources.Source), over n spread samples."""
    import statistics

    step = max(1, len(source) // n)
    ts = []
    for i in range(0, min(len(source), n * step), step):
        t0 = time.process_time()
        source.get(i)
        ts.append(time.process_time() - t0)
    return statistics.median(ts)
