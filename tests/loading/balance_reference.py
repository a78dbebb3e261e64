"""Today's balancer (main at 7f2e188), kept for comparison only: the speed-aware Karmarkar-Karp with a
K-slot list per sample, LPT scanning every rank per sample, the local search over every rank pair, and the
loose lower bound max(total/Σspeed, largest sample on its fastest rank). `reference_balance` is its
heuristic path (`balance(inst, backend=None)`): the scale benchmark and the tests compare the new plans
against it. Not imported by the package."""

from __future__ import annotations

import heapq
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


def stride(n: int, k: int) -> list[int]:
    """DistributedSampler's split: sample i of the batch goes to rank i mod k."""
    return [i % k for i in range(n)]


def lpt(inst: Instance) -> list[int] | None:
    """Longest processing time first onto the rank that finishes it earliest (speed-aware),
    within the caps and count rule; None when this greedy cannot place a sample."""
    lo, hi = inst.count_range()
    extra = inst.n - lo * inst.k  # ranks that may hold hi samples when hi > lo
    order = sorted(range(inst.n), key=lambda i: (-max(inst.weights[i]), i))
    loads, counts, toks = [0] * inst.k, [0] * inst.k, [0] * inst.k
    above = 0
    owner = [-1] * inst.n
    for i in order:
        best = None
        for r in range(inst.k):
            if counts[r] >= hi or (hi > lo and counts[r] >= lo and above >= extra):
                continue
            cap = inst.caps[r]
            if cap is not None and toks[r] + inst.tokens[i] > cap:
                continue
            key = (loads[r] + inst.weights[i][r], loads[r], r)
            if best is None or key < best:
                best = key
        if best is None:
            return None
        r = best[2]
        if hi > lo and counts[r] == lo:
            above += 1
        owner[i] = r
        loads[r] += inst.weights[i][r]
        counts[r] += 1
        toks[r] += inst.tokens[i]
    return owner if feasible(inst, owner) else None


def karmarkar_karp(inst: Instance) -> list[int]:
    """Largest differencing into k parts, speed-aware: parts are bound to ranks, a merge gives
    the most loaded rank (load/speed) of one partial solution the smallest part of the other,
    and the heap is keyed on the spread of load/speed. With equal speeds this is verl's
    `karmarkar_karp` (equal_size when counts must be equal). Caps are not enforced here."""
    k, n = inst.k, inst.n
    sp = inst.speeds
    fast = sorted(range(k), key=lambda r: (-sp[r], r))

    def base(i: int) -> float:  # rank-independent size of a sample (its cost up to a factor)
        return inst.weights[i][fast[0]] * sp[fast[0]]

    def spread(parts) -> float:
        norm = [parts[r][0] / sp[r] for r in range(k)]
        return max(norm) - min(norm)

    heap = []
    counter = 0
    order = sorted(range(n), key=lambda i: (-base(i), i))
    if inst.equal_counts:
        for c in range(0, n, k):
            chunk = order[c:c + k]
            parts = [[0.0, []] for _ in range(k)]
            for j, i in enumerate(chunk):
                r = fast[j]
                parts[r] = [base(i), [i]]
            heap.append((-spread(parts), counter, parts))
            counter += 1
    else:
        for i in order:
            parts = [[0.0, []] for _ in range(k)]
            parts[fast[0]] = [base(i), [i]]
            heap.append((-spread(parts), counter, parts))
            counter += 1
    heapq.heapify(heap)
    while len(heap) > 1:
        _, _, a = heapq.heappop(heap)
        _, _, b = heapq.heappop(heap)
        ranks_a = sorted(range(k), key=lambda r: (-a[r][0] / sp[r], r))
        parts_b = sorted(range(k), key=lambda r: (b[r][0], r))
        merged = [[0.0, []] for _ in range(k)]
        for ra, rb in zip(ranks_a, parts_b):
            merged[ra] = [a[ra][0] + b[rb][0], a[ra][1] + b[rb][1]]
        heapq.heappush(heap, (-spread(merged), counter, merged))
        counter += 1
    owner = [0] * n
    if heap:
        for r, (_, items) in enumerate(heap[0][2]):
            for i in items:
                owner[i] = r
    return owner


def improve(inst: Instance, owner: list[int], max_rounds: int | None = None) -> list[int]:
    """Local search from `owner`: move or swap one sample off the most loaded rank while that
    lowers it and the receiving rank ends below its old load (caps and counts kept). Each
    accepted step lowers (makespan, number of ranks at it) lexicographically, so it stops.
    Integer arithmetic throughout; ties go to the smallest (new load, move before swap, i, j, r)."""
    import numpy as np

    if inst.n == 0 or inst.k < 2:
        return list(owner)
    own = np.array(owner, dtype=np.int64)
    W = np.array(inst.weights, dtype=np.int64)
    tk = np.array(inst.tokens, dtype=np.int64)
    caps = [None if c is None else int(c) for c in inst.caps]
    loads = np.array(loads_of(inst, owner), dtype=np.int64)
    toks = np.bincount(own, weights=tk, minlength=inst.k).astype(np.int64)
    big = np.iinfo(np.int64).max
    for _ in range(max_rounds if max_rounds is not None else 4 * inst.n + 8):
        top = int(np.argmax(loads))  # first index among ties
        here = np.flatnonzero(own == top)
        best = None
        for r in range(inst.k):
            if r == top:
                continue
            if not inst.equal_counts:
                new = np.maximum(loads[top] - W[here, top], loads[r] + W[here, r])
                if caps[r] is not None:
                    new = np.where(toks[r] + tk[here] <= caps[r], new, big)
                j = int(np.argmin(new))
                if new[j] < loads[top]:
                    cand = (int(new[j]), 0, int(here[j]), -1, r)
                    best = cand if best is None or cand < best else best
            there = np.flatnonzero(own == r)
            if len(there) == 0:
                continue
            new = np.maximum(loads[top] - W[here, top][:, None] + W[there, top][None, :],
                             loads[r] - W[there, r][None, :] + W[here, r][:, None])
            dt = tk[here][:, None] - tk[there][None, :]
            ok = np.ones_like(new, dtype=bool)
            if caps[r] is not None:
                ok &= toks[r] + dt <= caps[r]
            if caps[top] is not None:
                ok &= toks[top] - dt <= caps[top]
            new = np.where(ok, new, big)
            flat = int(np.argmin(new))
            a, b = divmod(flat, len(there))
            if new[a, b] < loads[top]:
                cand = (int(new[a, b]), 1, int(here[a]), int(there[b]), r)
                best = cand if best is None or cand < best else best
        if best is None:
            break
        _, kind, i, j, r = best
        own[i] = r
        loads[top] -= W[i, top]
        loads[r] += W[i, r]
        toks[top] -= tk[i]
        toks[r] += tk[i]
        if kind == 1:
            own[j] = top
            loads[r] -= W[j, r]
            loads[top] += W[j, top]
            toks[r] -= tk[j]
            toks[top] += tk[j]
    return [int(x) for x in own]


def kk_parts(costs: Sequence[float], k: int, equal_size: bool = False) -> list[int]:
    """verl's balancing, ignoring rank speeds: KK on the given costs into k equal-speed parts."""
    return karmarkar_karp(make_instance(costs, [1.0] * k, equal_counts=equal_size))


def reference_balance(inst: Instance) -> Result:
    """Today's `balance(inst, backend=None)`: the better of KK and LPT, refined by `improve`."""
    lb = lower_bound(inst)
    cands = []
    kk = karmarkar_karp(inst)
    if feasible(inst, kk):
        cands.append((max(loads_of(inst, kk)), 0, "kk", kk))
    lp = lpt(inst)
    if lp is not None:
        cands.append((max(loads_of(inst, lp)), 1, "lpt", lp))
    best = min(cands)
    o = improve(inst, best[3])
    m = max(loads_of(inst, o))
    return _result(inst, o, best[2] + "+ls", "optimal" if m <= lb else "feasible", lb)
