"""The balance model: one global batch as integer weights w[i][r] (`make_instance`, the quantisation
rule of loading.balance), the `Result` of a plan, and its evaluation (loads, feasibility under the
token caps and count rule, the lower bound the gap is measured against)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from qsync_opt.errors import SpecError

WEIGHT_BITS = 20
"""The largest per-(sample, rank) weight is about 2**WEIGHT_BITS: quantisation error ≤ 2**-21
of the largest sample, far below timing noise; sums stay exact in every solver's doubles."""


@dataclass(frozen=True)
class Instance:
    """One global batch: integer weights w[i][r], token counts, caps and the count rule."""

    weights: tuple[tuple[int, ...], ...]
    tokens: tuple[int, ...]
    caps: tuple[int | None, ...]
    equal_counts: bool
    scale: float
    """Cost units per weight unit·speed: c_i / s_r ≈ w[i][r] · scale."""
    speeds: tuple[float, ...] = ()
    """Relative rank speeds the weights were made from."""

    @property
    def n(self) -> int:
        return len(self.weights)

    @property
    def k(self) -> int:
        return len(self.caps)

    def count_range(self) -> tuple[int, int]:
        if not self.equal_counts:
            return 0, self.n
        return self.n // self.k, -(-self.n // self.k)


def make_instance(costs: Sequence[float] | None, speeds: Sequence[float], tokens: Sequence[int] | None = None,
                  token_cap: int | Sequence[int | None] | None = None, equal_counts: bool = False,
                  rank_costs: Sequence[Sequence[float]] | None = None) -> Instance:
    """Integer weights w[i][r] ≈ c_i / s_r, or, with `rank_costs` (c[i][r]: each rank's own
    cost curve, e.g. one c(L) fitted per device group), w[i][r] ≈ c[i][r]; `speeds` then
    only order the ranks for Karmarkar-Karp and weight the lower bound (any positive values
    keep the bound valid)."""
    speeds = [float(s) for s in speeds]
    if not speeds or any(not math.isfinite(s) or s <= 0 for s in speeds):
        raise SpecError(f"balance: rank speeds must be finite and > 0, got {speeds}; give each rank's relative throughput")
    if rank_costs is not None:
        matrix = [[float(c) for c in row] for row in rank_costs]
        if any(len(row) != len(speeds) for row in matrix):
            raise SpecError(f"balance: rank_costs needs one cost per rank ({len(speeds)}) for every sample")
    else:
        matrix = [[float(c) / s for s in speeds] for c in costs]
    if any(not math.isfinite(c) or c < 0 for row in matrix for c in row):
        raise SpecError("balance: sample costs must be finite and >= 0")
    n = len(matrix)
    toks = tuple(int(t) for t in (tokens if tokens is not None else [0] * n))
    if len(toks) != n:
        raise SpecError(f"balance: {n} costs but {len(toks)} token counts")
    caps = tuple(token_cap) if isinstance(token_cap, (list, tuple)) else (token_cap,) * len(speeds)
    if len(caps) != len(speeds):
        raise SpecError(f"balance: {len(speeds)} ranks but {len(caps)} token caps")
    top = max((c for row in matrix for c in row), default=0.0)
    scale = top / 2**WEIGHT_BITS if top > 0 else 1.0
    w = tuple(tuple(int(round(c / scale)) for c in row) for row in matrix)
    return Instance(w, toks, tuple(None if c is None else int(c) for c in caps), bool(equal_counts), scale, tuple(speeds))


@dataclass
class Result:
    ranks: list[list[int]]
    """Sample positions per rank, ascending."""
    loads: list[int]
    makespan: int
    method: str
    status: str
    """'optimal' (proven by the exact program), or 'feasible'."""
    bound: int
    """A lower bound on the optimal makespan (weight units): the gap is measured against it."""
    plan_s: float = 0.0
    detail: dict = field(default_factory=dict)

    @property
    def gap(self) -> float:
        return max(0.0, self.makespan - self.bound) / max(self.makespan, 1)

    def owner(self) -> list[int]:
        out = [0] * sum(len(r) for r in self.ranks)
        for r, items in enumerate(self.ranks):
            for i in items:
                out[i] = r
        return out


# ---- evaluation ---------------------------------------------------------------------------
def loads_of(inst: Instance, owner: Sequence[int]) -> list[int]:
    loads = [0] * inst.k
    for i, r in enumerate(owner):
        loads[r] += inst.weights[i][r]
    return loads


def feasible(inst: Instance, owner: Sequence[int]) -> bool:
    lo, hi = inst.count_range()
    counts, toks = [0] * inst.k, [0] * inst.k
    for i, r in enumerate(owner):
        counts[r] += 1
        toks[r] += inst.tokens[i]
    return all(lo <= c <= hi for c in counts) and all(
        cap is None or t <= cap for t, cap in zip(toks, inst.caps))


def lower_bound(inst: Instance) -> int:
    """max(ceil(Σ_i min_r w·s / Σ_r s), max_i min_r w[i][r]): no assignment beats it."""
    if inst.n == 0:
        return 0
    sp = inst.speeds
    total = sum(min(inst.weights[i][r] * sp[r] for r in range(inst.k)) for i in range(inst.n))
    frac = total / sum(sp)
    single = max(min(row) for row in inst.weights)
    return max(int(math.ceil(frac * (1 - 1e-9) - 1e-9)) if frac > 0 else 0, single)


def _result(inst: Instance, owner: Sequence[int], method: str, status: str, bound: int, **detail) -> Result:
    ranks: list[list[int]] = [[] for _ in range(inst.k)]
    for i, r in enumerate(owner):
        ranks[r].append(i)
    loads = loads_of(inst, owner)
    return Result(ranks, loads, max(loads, default=0), method, status, bound, detail=dict(detail))
