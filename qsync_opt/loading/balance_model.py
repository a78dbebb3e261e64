"""The balance model: one global batch as integer weights w[i][r] (`make_instance`, the quantisation
rule of loading.balance), the `Result` of a plan, and its evaluation (loads, feasibility under the
token caps and count rule, the lower bounds the gap is measured against: area, single-sample,
large-sample area and counting)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from qsync_opt.errors import SpecError

WEIGHT_BITS = 20
"""The largest per-(sample, rank) weight is about 2**WEIGHT_BITS: quantisation error ≤ 2**-21
of the largest sample, far below timing noise; sums stay exact in every solver's doubles."""


@dataclass(frozen=True, eq=False)
class Instance:
    """One global batch: integer weights w[i][r], token counts, caps and the count rule.

    The weights are stored once per distinct column: `cols[:, c]` is the weight of every sample on
    a rank of class c and `rank_col[r]` is rank r's class (ranks of one speed, or with the same
    cost curve, share a column), so a batch of N samples over K ranks of d speeds holds N·d
    integers, not N·K. `W` (N x K) and `weights` (tuples) materialise the full matrix for the
    exact program and small cases."""

    cols: np.ndarray
    """N x d int64: the distinct weight columns."""
    rank_col: tuple[int, ...]
    """Rank r's column in `cols`."""
    tokens: tuple[int, ...]
    caps: tuple[int | None, ...]
    equal_counts: bool
    scale: float
    """Cost units per weight unit·speed: c_i / s_r ≈ w[i][r] · scale."""
    speeds: tuple[float, ...] = ()
    """Relative rank speeds the weights were made from."""

    @property
    def n(self) -> int:
        return int(self.cols.shape[0])

    @property
    def k(self) -> int:
        return len(self.caps)

    @property
    def d(self) -> int:
        return int(self.cols.shape[1])

    @cached_property
    def rank_cols(self) -> np.ndarray:
        return np.asarray(self.rank_col, dtype=np.int64)

    @cached_property
    def class_size(self) -> np.ndarray:
        """How many ranks share each column."""
        return np.bincount(self.rank_cols, minlength=self.d).astype(np.int64)

    @cached_property
    def order(self) -> np.ndarray:
        """Samples by their largest weight, descending; index breaks ties (LPT's and the
        counting bound's order)."""
        return np.argsort(-self.cols.max(axis=1), kind="stable")

    @cached_property
    def tok(self) -> np.ndarray:
        return np.asarray(self.tokens, dtype=np.int64)

    @cached_property
    def W(self) -> np.ndarray:
        """N x K int64 weights w[i][r] (materialised on first use)."""
        return self.cols[:, self.rank_cols]

    @cached_property
    def weights(self) -> tuple[tuple[int, ...], ...]:
        """w[i][r] as nested tuples of Python ints."""
        return tuple(tuple(row) for row in self.W.tolist())

    def count_range(self) -> tuple[int, int]:
        if not self.equal_counts:
            return 0, self.n
        return self.n // self.k, -(-self.n // self.k)


def make_instance(costs: Sequence[float] | None, speeds: Sequence[float], tokens: Sequence[int] | None = None,
                  token_cap: int | Sequence[int | None] | None = None, equal_counts: bool = False,
                  rank_costs: Sequence[Sequence[float]] | None = None) -> Instance:
    """Integer weights w[i][r] = round(c_i / s_r / scale), or, with `rank_costs` (c[i][r]: each
    rank's own cost curve, e.g. one c(L) fitted per device group), w[i][r] = round(c[i][r] / scale),
    the scale putting the largest weight at 2**WEIGHT_BITS; `speeds` then only order the ranks for
    Karmarkar-Karp and weight the lower bound (any positive values keep the bound valid)."""
    speeds = [float(s) for s in speeds]
    if not speeds or any(not math.isfinite(s) or s <= 0 for s in speeds):
        raise SpecError(f"balance: rank speeds must be finite and > 0, got {speeds}; give each rank's relative throughput")
    k = len(speeds)
    if rank_costs is not None:
        matrix = np.asarray(rank_costs, dtype=float)
        if matrix.size == 0:
            matrix = matrix.reshape(0, k)
        if matrix.ndim != 2 or matrix.shape[1] != k:
            raise SpecError(f"balance: rank_costs needs one cost per rank ({k}) for every sample")
    else:
        c = np.asarray(list(costs), dtype=float).reshape(-1)
        uniq, inv = np.unique(np.asarray(speeds), return_inverse=True)
        matrix = c[:, None] / uniq[None, :]
    if not bool(np.isfinite(matrix).all()) or bool((matrix < 0).any()):
        raise SpecError("balance: sample costs must be finite and >= 0")
    n = matrix.shape[0]
    toks = tuple(np.asarray(tokens if tokens is not None else np.zeros(n), dtype=np.int64).reshape(-1).tolist())
    if len(toks) != n:
        raise SpecError(f"balance: {n} costs but {len(toks)} token counts")
    caps = tuple(token_cap) if isinstance(token_cap, (list, tuple)) else (token_cap,) * k
    if len(caps) != k:
        raise SpecError(f"balance: {k} ranks but {len(caps)} token caps")
    top = float(matrix.max()) if matrix.size else 0.0
    scale = top / 2**WEIGHT_BITS if top > 0 else 1.0
    w = np.rint(matrix / scale).astype(np.int64)
    if rank_costs is not None:  # identical columns (ranks of one device group) share one
        cols, inv = np.unique(w, axis=1, return_inverse=True) if n else (np.zeros((0, 1), np.int64), np.zeros(k, int))
    else:
        cols = w
    return Instance(np.ascontiguousarray(cols), tuple(int(x) for x in np.asarray(inv).reshape(-1)), toks,
                    tuple(None if c is None else int(c) for c in caps), bool(equal_counts), scale, tuple(speeds))


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
        out = np.zeros(sum(len(r) for r in self.ranks), dtype=np.int64)
        for r, items in enumerate(self.ranks):
            out[items] = r
        return out.tolist()


# ---- evaluation ---------------------------------------------------------------------------
def loads_np(inst: Instance, owner) -> np.ndarray:
    """Per-rank load Σ w[i][owner_i] as int64."""
    own = np.asarray(owner, dtype=np.int64)
    if inst.n == 0:
        return np.zeros(inst.k, dtype=np.int64)
    w = inst.cols[np.arange(inst.n), inst.rank_cols[own]]
    # float sums are exact: every load is below 2**(WEIGHT_BITS + 33)
    return np.bincount(own, weights=w, minlength=inst.k).astype(np.int64)


def loads_of(inst: Instance, owner: Sequence[int]) -> list[int]:
    return [int(x) for x in loads_np(inst, owner)]


def feasible(inst: Instance, owner: Sequence[int]) -> bool:
    lo, hi = inst.count_range()
    own = np.asarray(owner, dtype=np.int64)
    if len(own) != inst.n or (inst.n and (own.min() < 0 or own.max() >= inst.k)):
        return False
    counts = np.bincount(own, minlength=inst.k)
    if not bool(((counts >= lo) & (counts <= hi)).all()):
        return False
    if all(c is None for c in inst.caps):
        return True
    toks = np.bincount(own, weights=inst.tok, minlength=inst.k)
    return all(cap is None or t <= cap for t, cap in zip(toks.tolist(), inst.caps))


def area_bound(inst: Instance) -> int:
    """ceil(Σ_i min_r w[i][r]·s_r / Σ_r s_r): a rank's load ≤ T means Σ of its samples' w·s ≤ T·s_r;
    summed over ranks, every sample at least at its cheapest w·s, so T ≥ that sum / Σ s (any
    positive s, so also with per-rank cost curves)."""
    if inst.n == 0:
        return 0
    frac = float(_cheapest_work(inst).sum()) / float(sum(inst.speeds))
    return int(math.ceil(frac * (1 - 1e-9) - 1e-9)) if frac > 0 else 0


def _cheapest_work(inst: Instance) -> np.ndarray:
    """min_r w[i][r]·s_r per sample (the area bound's summand)."""
    best = None
    for c, s in sorted(set(zip(inst.rank_col, inst.speeds))):
        v = inst.cols[:, c] * s
        best = v if best is None else np.minimum(best, v)
    return best


def large_area_bound(inst: Instance) -> int:
    """The area bound over the j largest samples and the ranks that can hold any of them, max over j.

    Take the first j samples in `Instance.order` (set A) and q_c(j) = min of w[i][c] over A. Proof:
    in an optimal assignment of makespan T*, a rank of class c holds a sample of A only if
    q_c(j) ≤ T*; the samples of A run on such ranks, each within T* of load, so
    Σ_A min_r w·s ≤ T*·Σ {s_r : q_c(r)(j) ≤ T*}. With the classes sorted by q_c(j), the least T
    meeting that is min over m of max(q_(m)(j), Σ_A min_r w·s / (speed of the m first classes)).
    It binds where the large samples cannot go to slow ranks: a long sample that would take a slow
    rank past the bound must share the fast ranks with the other long ones."""
    n = inst.n
    if n == 0:
        return 0
    order = inst.order
    S = np.cumsum(_cheapest_work(inst)[order])
    q = np.minimum.accumulate(inst.cols[order], axis=0).astype(float)  # n x d
    P = np.zeros(inst.d)
    np.add.at(P, inst.rank_cols, np.asarray(inst.speeds, dtype=float))
    by = np.argsort(q, axis=1, kind="stable")
    qs = np.take_along_axis(q, by, axis=1)
    Ps = np.cumsum(P[by], axis=1)
    T = np.maximum(qs, S[:, None] / Ps).min(axis=1)
    top = float(T.max())
    return int(math.ceil(top * (1 - 1e-9) - 1e-9)) if top > 0 else 0


def single_bound(inst: Instance) -> int:
    """max_i min_r w[i][r]: every sample runs somewhere."""
    if inst.n == 0:
        return 0
    return int(inst.cols.min(axis=1).max())


def counting_bound(inst: Instance, at_least: int = 0) -> int:
    """The counting bound: max over j of T_j, the least T at which the j largest samples fit by count.

    Order the samples by their largest weight, descending (index breaks ties), and let
    q_c(j) = min of w[i][c] over the first j samples (c a rank class of k_c ranks). Proof: in an
    optimal assignment of makespan T*, a rank of class c holds samples of the first j, each of
    weight ≥ q_c(j) there, within load ≤ T*, so at most floor(T*/q_c(j)) of them (any number when
    q_c(j) = 0); all j are placed, so Σ_c k_c·floor(T*/q_c(j)) ≥ j, i.e. T* ≥ T_j, the least
    integer T with that count, for every j. With equal speeds T_j = ceil(j/K)·w_j (K+1 equal
    samples on K ranks: 2w, where total/K gives (1+1/K)·w); with speeds, a rank of speed s fits
    floor(s·T/c_j) samples of cost ≥ c_j. Caps and the count rule only remove assignments, so
    the bound holds with them. Returns max(at_least, max_j T_j); only the j whose T_j can exceed
    `at_least` are searched (vectorised bisection, about 40 passes over them)."""
    n = inst.n
    if n == 0:
        return int(at_least)
    q = np.minimum.accumulate(inst.cols[inst.order], axis=0)  # n x d
    kc = inst.class_size.astype(np.int64)
    j = np.arange(1, n + 1, dtype=np.int64)
    # T_j ≤ u_j: the class c alone holds ceil(j/k_c) each at T = ceil(j/k_c)·q_c(j)
    u = (-(-j[:, None] // kc[None, :]) * q).min(axis=1)
    zero = (q == 0).any(axis=1)  # a class fits any number of them: T_j = 0
    best = int(at_least)
    sel = np.flatnonzero((u > best) & ~zero)
    if len(sel) == 0:
        return best
    qs, js, hi = q[sel], j[sel], u[sel]
    # T_j ≥ j / Σ_c k_c/q_c(j) (floor(x) ≤ x); start below it and below `at_least`
    dens = (kc[None, :] / qs).sum(axis=1)
    lo = np.maximum(np.floor(js / dens).astype(np.int64) - 1, best)

    def fits(T):
        return (kc[None, :] * (T[:, None] // qs)).sum(axis=1) >= js

    keep = ~fits(lo)  # where the count already fits at `at_least`, T_j ≤ at_least
    lo, hi, qs, js = lo[keep], hi[keep], qs[keep], js[keep]
    while len(lo) and bool((hi - lo > 1).any()):
        mid = (lo + hi) // 2
        ok = fits(mid)
        hi = np.where(ok, mid, hi)
        lo = np.where(ok, lo, mid)
    return max(best, int(hi.max())) if len(hi) else best


def lower_bound(inst: Instance) -> int:
    """A lower bound on the optimal makespan: the largest of the area bound (total work over total
    speed), the single-sample bound (the largest sample on its cheapest rank), the large-sample
    area bound (`large_area_bound`) and the counting bound (`counting_bound`). No assignment
    beats it."""
    if inst.n == 0:
        return 0
    return counting_bound(inst, max(area_bound(inst), single_bound(inst), large_area_bound(inst)))


def result_of(inst: Instance, owner: Sequence[int], method: str, status: str, bound: int, **detail) -> Result:
    """The Result of assignment `owner` (sample -> rank): its ranks' sample lists and loads."""
    own = np.asarray(owner, dtype=np.int64)
    order = np.argsort(own, kind="stable")
    cuts = np.searchsorted(own[order], np.arange(inst.k + 1))
    ranks = [order[cuts[r]:cuts[r + 1]].tolist() for r in range(inst.k)]
    loads = loads_of(inst, own)
    return Result(ranks, loads, max(loads, default=0), method, status, bound, detail=dict(detail))
