"""Lagrangian bound, plan and variable fixing for one group's program (accuracy objective).

One group with a time row and a memory row is a resource-constrained shortest path over its
cast graph. Moving both rows into the objective with multipliers λ, μ ≥ 0,

    L(λ, μ) = min_x  Σ ω(x) + λ (time(x) − T) + μ (mem(x) − M)  ≤  the optimum,

and the inner minimum is an exact DP over the cast graph (lagrange_dp.py): a proven bound in
plan units for any λ, μ ≥ 0. L is concave; it is maximised by cutting planes (each DP gives a
plane through its minimiser), K multipliers per DP pass. The minimisers that fit both rows are
plans; the best, improved by single-op moves, is the incumbent. Where the least L with op i
pinned to precision p (a min-marginal) exceeds the incumbent, no plan better than the
incumbent runs op i at p, so p is removed: the exact program left for the MIP is much smaller.
On a chain L equals the LP bound of the arc formulation; on a DAG its DP is exact over the
skip edges too, so it is at least as tight.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from qsync_opt.training.program.instance import GroupInstance, TrainingInstance
from qsync_opt.training.program.lagrange_dp import Chainlike, Energy, decomposition, steps
from qsync_opt.solver.backends.quiet import swallow_highs_banner

MAX_TABLE = 4096
"""Largest DP table (P ** bag size) per batch entry; wider cast graphs go to the MIP unaided."""
ROW_TOL = 1e-9
"""A DP minimiser is a plan when its rows hold within this relative margin of the bound (evaluate allows 1e-6)."""


@dataclass(frozen=True)
class GroupArrays:
    ops: tuple[str, ...]
    allowed: tuple[tuple[str, ...], ...]
    omega: np.ndarray
    """(n, P) share-weighted indicator, +inf where not allowed: the group's objective in plan units."""
    rows: np.ndarray
    """(2, n, P) time and memory, each divided by its right-hand side (0 where the row is absent)."""
    cast: np.ndarray
    """(E, P, P) cast time divided by the time right-hand side."""
    active: tuple[bool, bool]
    d: Chainlike
    plan: list
    """lagrange_dp.steps(d), computed once."""


def group_arrays(instance: TrainingInstance, g: GroupInstance) -> GroupArrays | None:
    """The arrays of `g`, or None when the DP does not apply (rows already broken, graph too wide)."""
    ops = tuple(g.allowed)
    pos = {op: i for i, op in enumerate(ops)}
    width = max(len(ps) for ps in g.allowed.values())
    t_rhs = None if g.time_bound_ms is None else g.time_bound_ms - g.fixed_ms
    m_rhs = None if not math.isfinite(g.mem_capacity_bytes) else g.mem_capacity_bytes - g.fixed_mem_bytes
    if (t_rhs is not None and t_rhs <= 0) or (m_rhs is not None and m_rhs <= 0):
        return None
    n = len(ops)
    omega = np.full((n, width), np.inf)
    rows = np.zeros((2, n, width))
    for i, op in enumerate(ops):
        for j, p in enumerate(g.allowed[op]):
            omega[i, j] = g.share * instance.omega[op][p]
            rows[0, i, j] = g.time_ms[op][p] / t_rhs if t_rhs else 0.0
            rows[1, i, j] = g.mem_bytes[op][p] / m_rhs if m_rhs else 0.0
    merged: dict[tuple[int, int], np.ndarray] = {}
    for (a, b), table in g.cast_ms.items():
        ia, ib = pos[a], pos[b]
        c = merged.setdefault((min(ia, ib), max(ia, ib)), np.zeros((width, width)))
        for (pa, pb), v in table.items():
            if pa in g.allowed[a] and pb in g.allowed[b] and t_rhs:
                ja, jb = g.allowed[a].index(pa), g.allowed[b].index(pb)
                if ia < ib:
                    c[ja, jb] += v / t_rhs
                elif ia > ib:
                    c[jb, ja] += v / t_rhs
                else:
                    return None  # a self-edge: leave it to the MIP
    keys = sorted(merged)
    edges = np.array(keys, dtype=np.int64).reshape(-1, 2)
    d = decomposition(n, width, edges)
    if d.largest_table > MAX_TABLE:
        return None
    cast = np.stack([merged[k] for k in keys]) if keys else np.zeros((0, width, width))
    return GroupArrays(ops, tuple(g.allowed[op] for op in ops), omega, rows, cast,
                       (t_rhs is not None, m_rhs is not None), d, steps(d))


@dataclass
class LagrangeResult:
    bound: float
    """max L over the multipliers tried: no plan of the group beats it (plan units)."""
    plan: dict[str, str] | None
    objective: float | None
    keep: dict[str, tuple[str, ...]]
    """Precisions that may still be in a plan better than the incumbent (all, without one)."""
    fixed_floor: float
    """The least min-marginal among removed precisions (inf when none): plans using one are worse."""
    dp_passes: int
    seconds: float

    @property
    def kept(self) -> int:
        return sum(len(a) for a in self.keep.values())


class _Evaluator:
    def __init__(self, ga: GroupArrays):
        self.ga = ga
        self.ea, self.eb = (ga.d.edges[:, 0], ga.d.edges[:, 1]) if len(ga.d.edges) else (np.zeros(0, int),) * 2
        self.rows_ = np.arange(ga.omega.shape[0])
        nb: list[list[int]] = [[] for _ in self.rows_]
        for a, b in ga.d.edges:
            nb[a].append(int(b))
            nb[b].append(int(a))
        self.neighbours = [np.array(v, dtype=np.int64) for v in nb]

    def parts(self, x: np.ndarray) -> np.ndarray:
        """(K, 3): objective, time row, memory row (normalised, rhs 1) of plans x (K, n)."""
        ga, r = self.ga, self.rows_
        f = ga.omega[r, x].sum(axis=1)
        t = ga.rows[0][r, x].sum(axis=1)
        if len(self.ea):
            t = t + ga.cast[np.arange(len(self.ea)), x[:, self.ea], x[:, self.eb]].sum(axis=1)
        m = ga.rows[1][r, x].sum(axis=1)
        return np.stack([f, t, m], axis=1)

    def energy(self, lam: np.ndarray) -> Energy:
        ga = self.ga
        u = ga.omega[None] + lam[:, 0, None, None] * ga.rows[0][None] + lam[:, 1, None, None] * ga.rows[1][None]
        w = lam[:, 0, None, None, None] * ga.cast[None]
        return Energy(ga.d, u, w, ga.plan)


def solve_dual(ga: GroupArrays, deadline: float, target_gap: float = 1e-4, max_passes: int = 40,
               start: dict[str, str] | None = None) -> LagrangeResult:
    """Maximise L by batched cutting planes until it meets the incumbent within target_gap, stalls, or time ends.

    `start` (op -> precision, e.g. greedy's plan) is the first incumbent if it keeps both rows."""
    t0 = time.perf_counter()
    ev = _Evaluator(ga)
    finite = np.where(np.isfinite(ga.omega), ga.omega, np.nan)
    spread = float(np.nansum(np.nanmax(finite, axis=1) - np.nanmin(finite, axis=1)))
    scale = max(spread, 1e-300)
    box = np.array([scale if a else 0.0 for a in ga.active])
    grid = [0.0, scale / 16, scale / 4]  # spans where the optima lie (docs/program.md)
    pts = [(a, b) for a in (grid if ga.active[0] else [0.0]) for b in (grid if ga.active[1] else [0.0])]
    lam = np.array(pts, dtype=np.float64)
    cuts, best = [], (-math.inf, None)
    inc_x, inc_f = None, math.inf
    if start is not None:
        x0 = np.array([ga.allowed[i].index(start[op]) for i, op in enumerate(ga.ops)])
        part0 = ev.parts(x0[None])[0]
        if part0[1] <= 1 + 1e-12 and part0[2] <= 1 + 1e-12:  # greedy fills rows to the bound exactly
            inc_x, inc_f = x0, float(part0[0])
    passes = 0
    while True:
        passes += 1
        t_pass = time.perf_counter()
        e = ev.energy(lam)
        _, low, picks = e.forward()
        x = e.argmin(picks)
        part = ev.parts(x)
        values = low - lam[:, 0] * ga.active[0] - lam[:, 1] * ga.active[1]
        for k in range(len(lam)):
            cuts.append(part[k])
            v = _safe(values[k], part[k], lam[k])
            if v > best[0]:
                best = (v, lam[k].copy())
            if part[k, 1] <= 1 - ROW_TOL and part[k, 2] <= 1 - ROW_TOL and part[k, 0] < inc_f:
                inc_x, inc_f = x[k].copy(), float(part[k, 0])
        if inc_x is not None and (passes == 1 or passes % 4 == 0):
            inc_x, inc_f = improve(ev, inc_x, inc_f)
        top, point = _cut_lp(np.array(cuts), box, ga.active)
        for j in range(2):  # the box stops the model from running off; widen it where it binds
            if ga.active[j] and point[j] >= box[j] * (1 - 1e-9):
                box[j] *= 8.0
        # done: the incumbent is proven, or the cutting-plane model's peak is within 1e-7 of the best L
        # (a looser stop measured worse: an early, poor incumbent made every gap look small)
        done = (inc_f - best[0] <= target_gap * max(abs(inc_f), 1e-300)
                or top - best[0] <= 1e-7 * max(abs(best[0]), 1e-300))
        now = time.perf_counter()
        if done or passes >= max_passes or now + 1.5 * (now - t_pass) > deadline:
            break
        b = best[1]
        lam = np.array([point, b + 0.5 * (point - b), b + 0.2 * (point - b), b + 0.05 * (point - b)])
        lam = np.maximum(lam, 0.0)
    for k in range(len(x)):  # the last minimisers sit nearest the dual optimum: repair them into plans
        if (y := repair(ev, x[k])) is not None:
            y, fy = improve(ev, y, float(ev.parts(y[None])[0, 0]))
            if fy < inc_f:
                inc_x, inc_f = y, fy
    if inc_x is not None:
        inc_x, inc_f = improve(ev, inc_x, inc_f)
    keep, floor = _fix(ev, best, inc_f, cuts) if inc_x is not None else (
        {op: ps for op, ps in zip(ga.ops, ga.allowed)}, math.inf)
    plan = None if inc_x is None else {op: ga.allowed[i][int(inc_x[i])] for i, op in enumerate(ga.ops)}
    return LagrangeResult(best[0], plan, None if inc_x is None else inc_f, keep, floor, passes + 1,
                          time.perf_counter() - t0)


def _safe(value: float, part: np.ndarray, lam: np.ndarray) -> float:
    """L less a margin for floating-point rounding of its sums (it must never exceed the optimum)."""
    mag = abs(part[0]) + lam[0] * abs(part[1]) + lam[1] * abs(part[2]) + lam.sum()
    return float(value - 1e-11 * mag)


def _cut_lp(cuts: np.ndarray, box: np.ndarray, active) -> tuple[float, np.ndarray]:
    """max z s.t. z ≤ f_k + λ (t_k − 1) + μ (m_k − 1), 0 ≤ λ, μ ≤ box: the cutting-plane model's peak."""
    import highspy

    swallow_highs_banner()
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    inf = highspy.kHighsInf
    lp = highspy.HighsLp()
    lp.num_col_ = 3
    lp.col_cost_ = np.array([0.0, 0.0, -1.0])
    lp.col_lower_ = np.array([0.0, 0.0, -inf])
    lp.col_upper_ = np.array([box[0], box[1], inf])
    k = len(cuts)
    g = np.where(active[0], cuts[:, 1] - 1.0, 0.0)
    m = np.where(active[1], cuts[:, 2] - 1.0, 0.0)
    lp.num_row_ = k
    lp.row_lower_ = np.full(k, -inf)
    lp.row_upper_ = cuts[:, 0].astype(np.float64)
    lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
    lp.a_matrix_.num_col_ = 3
    lp.a_matrix_.num_row_ = k
    lp.a_matrix_.start_ = np.arange(0, 3 * k + 1, 3, dtype=np.int32)
    lp.a_matrix_.index_ = np.tile(np.array([0, 1, 2], dtype=np.int32), k)
    lp.a_matrix_.value_ = np.stack([-g, -m, np.ones(k)], axis=1).ravel()
    h.passModel(lp)
    h.run()
    col = np.array(h.getSolution().col_value)
    return float(col[2]), col[:2].copy()


def _deltas(ev: _Evaluator, x: np.ndarray):
    """Row use of plan x and, for every (op, precision), the change of objective, time and memory."""
    ga = ev.ga
    n, width = ga.omega.shape
    r, e = ev.rows_, np.arange(len(ev.ea))
    used = ev.parts(x[None])[0]
    d_f = ga.omega - ga.omega[r, x][:, None]
    d_t = ga.rows[0] - ga.rows[0][r, x][:, None]
    d_m = ga.rows[1] - ga.rows[1][r, x][:, None]
    if len(e):  # a new precision at one end changes that edge's cast
        now = ga.cast[e, x[ev.ea], x[ev.eb]]
        at_a = ga.cast[e, :, x[ev.eb]] - now[:, None]
        at_b = ga.cast[e, x[ev.ea], :] - now[:, None]
        for p in range(width):
            d_t[:, p] += np.bincount(ev.ea, at_a[:, p], n) + np.bincount(ev.eb, at_b[:, p], n)
    return used, d_f, d_t, d_m


def _apply(ev: _Evaluator, x: np.ndarray, score: np.ndarray, d_t, d_m, t_used, m_used, ok) -> bool:
    """Take each op's best-scoring move, best first, skipping neighbours of moved ops and moves `ok` rejects."""
    r = ev.rows_
    best_p = score.argmax(axis=1)
    cand = np.flatnonzero(np.isfinite(score[r, best_p]))
    cand = cand[np.argsort(-score[cand, best_p[cand]])]
    blocked, moved = np.zeros(len(r), dtype=bool), False
    for i in cand:
        p = best_p[i]
        if blocked[i] or not ok(t_used + d_t[i, p], m_used + d_m[i, p]):
            continue
        x[i] = p
        t_used, m_used, moved = t_used + d_t[i, p], m_used + d_m[i, p], True
        blocked[ev.neighbours[i]] = True
    return moved


def improve(ev: _Evaluator, x: np.ndarray, f: float, max_rounds: int = 200) -> tuple[np.ndarray, float]:
    """Single-op moves that lower the objective and keep both rows, best gain first, until none fits.

    Each round takes many moves at once, but never two on neighbouring ops (a move changes its
    neighbours' cast deltas), and checks the rows against the running totals."""
    x = x.copy()
    fits_ = lambda t, m: t <= 1 - ROW_TOL and m <= 1 - ROW_TOL  # noqa: E731
    for _ in range(max_rounds):
        used, d_f, d_t, d_m = _deltas(ev, x)
        fits = (used[1] + d_t <= 1 - ROW_TOL) & (used[2] + d_m <= 1 - ROW_TOL) & (d_f < -1e-15 * max(abs(f), 1e-300))
        if not fits.any() or not _apply(ev, x, np.where(fits, -d_f, -np.inf), d_t, d_m, used[1], used[2], fits_):
            break
        f = float(ev.parts(x[None])[0, 0])
    return x, f


def repair(ev: _Evaluator, x: np.ndarray, max_rounds: int = 100) -> np.ndarray | None:
    """A plan near x that fits both rows: moves that cut the excess at the least objective per unit cut."""
    x = x.copy()
    for _ in range(max_rounds):
        used, d_f, d_t, d_m = _deltas(ev, x)
        over_t, over_m = used[1] > 1 - ROW_TOL, used[2] > 1 - ROW_TOL
        if not over_t and not over_m:
            return x
        cut = over_t * np.maximum(-d_t, 0) / max(used[1], 1e-300) + over_m * np.maximum(-d_m, 0) / max(used[2], 1e-300)
        worse = (~over_t & (used[1] + d_t > 1 - ROW_TOL)) | (~over_m & (used[2] + d_m > 1 - ROW_TOL))
        score = np.where((cut > 0) & ~worse, -np.maximum(d_f, 0) / np.maximum(cut, 1e-300) - 1e-300 * d_f, -np.inf)
        if not np.isfinite(score).any():
            return None
        _apply(ev, x, score, d_t, d_m, used[1], used[2], lambda t, m: True)
    return None


def _fix(ev: _Evaluator, best, inc_f: float, cuts) -> tuple[dict[str, tuple[str, ...]], float]:
    """Precisions whose min-marginal at the best multipliers stays ≤ the incumbent; the least one removed."""
    ga = ev.ga
    lam = best[1][None]
    e = ev.energy(lam)
    msgs, _, _ = e.forward()
    mm = e.min_marginals(msgs)[0] - lam[0, 0] * ga.active[0] - lam[0, 1] * ga.active[1]
    with np.errstate(invalid="ignore"):  # padded entries are +inf and stay so
        mm = np.where(np.isfinite(mm), mm - 1e-11 * (np.abs(mm) + abs(inc_f) + lam.sum()), mm)  # rounding margin, as in _safe
    keep, floor = {}, math.inf
    slack = 1e-12 * max(abs(inc_f), 1e-300)
    for i, op in enumerate(ga.ops):
        ok = []
        for j, p in enumerate(ga.allowed[i]):
            if mm[i, j] > inc_f + slack:  # no plan better than the incumbent runs op at p
                floor = min(floor, float(mm[i, j]))
            else:
                ok.append(p)
        keep[op] = tuple(ok)
    return keep, floor
