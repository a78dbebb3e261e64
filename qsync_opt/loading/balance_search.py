"""The balance local search: refine an assignment (`improve`, `improve_wide`). It first pairs the
ranks above its goal with the least loaded ones and trades in all pairs at once, then works on the
most loaded rank against each class's least loaded rank (moves) and the `SWAP_RANKS` least loaded
ranks of each class (swaps, each one's best partner found by bisection on sorted weights), and
stops once the lower bound proves it within `LS_GAP` of the optimum. Pure and deterministic."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from qsync_opt.loading.balance_model import Instance, loads_np

PAIR_PATIENCE = 8
"""The pairs phase stops after this many rounds in a row without a trade (each such round pairs
every high rank with the next low one)."""
SWAP_RANKS = 16
"""The single-rank phase tries swaps with this many of the least loaded ranks of each class (all
when fewer): a rank near the top can only take a small difference, so the least loaded hold the
best swaps."""
EXHAUSTIVE_CELLS = 4096
"""Up to this many samples x ranks the local search also tries every pair of every rank."""
LS_GAP = 1e-4
"""The local search stops once its slowest rank is within this fraction of the lower bound: what
is left to win is below it (and below timing noise by orders of magnitude)."""


def _improve_seq(inst: Instance, owner: Sequence[int], max_rounds: int | None = None, lower: int = 0,
                 gap: float = 0.0, every_pair: bool = False, every_rank: bool = False, stop=None) -> list[int]:
    """Local search from `owner`: move or swap one sample off the most loaded rank while that
    lowers it and the receiving rank ends below its old load (caps and counts kept). Each
    accepted step lowers (makespan, number of ranks at it) lexicographically, so it stops; it
    also stops once the makespan is within `gap` of `lower` (a lower bound: nothing left to win
    beyond that) or after `max_rounds` steps (default 4N + 8). Receivers: for a move, each
    class's least loaded rank (every rank when caps bind); for a swap, the `SWAP_RANKS` least loaded
    ranks of each class, each one's best
    partner sample found by bisection (exact for ranks whose weights order the samples alike,
    as speed-scaled ones do; every pair when caps bind). Integer arithmetic throughout; ties go
    to the smallest new load, a move before a swap."""
    n, k = inst.n, inst.k
    if n == 0 or k < 2:
        return list(owner)
    own = np.array(owner, dtype=np.int64)
    cols, rc = inst.cols, inst.rank_cols
    tk = inst.tok
    big = np.iinfo(np.int64).max // 4
    capped = any(c is not None for c in inst.caps)
    cap = np.array([big if c is None else int(c) for c in inst.caps], dtype=np.int64)
    loads = loads_np(inst, own)
    toks = np.bincount(own, weights=tk, minlength=k).astype(np.int64) if capped else None
    members = [np.flatnonzero(rc == c) for c in range(inst.d)] if inst.d <= 8 else None
    moves_ok = not inst.equal_counts
    S = 1 << 24  # > any w_top + w_r (weights ≤ 2**WEIGHT_BITS)
    for _ in range(max_rounds if max_rounds is not None else seq_rounds(n, k)):
        if stop is not None and stop():
            break
        top = int(np.argmax(loads))  # first index among ties
        Lt = int(loads[top])
        if Lt <= lower or Lt - lower <= gap * Lt:
            break
        here = np.flatnonzero(own == top)
        if len(here) == 0:
            break
        ct = int(rc[top])
        wt = cols[here, ct]
        best = None  # (new, kind, i, j, r)
        if moves_ok:
            if members is not None and not (capped or every_pair):
                recv = []
                for m in members:
                    m = m[m != top]
                    if len(m):
                        recv.append(int(m[np.argmin(loads[m])]))
                recv = np.array(sorted(recv), dtype=np.int64)
            else:
                recv = np.delete(np.arange(k), top)
            if len(recv):
                new = np.maximum(Lt - wt[:, None], loads[recv][None, :] + cols[here][:, rc[recv]])
                if capped:
                    new = np.where(toks[recv][None, :] + tk[here][:, None] <= cap[recv][None, :], new, big)
                a, b = divmod(int(np.argmin(new)), len(recv))
                if new[a, b] < Lt:
                    best = (int(new[a, b]), 0, int(here[a]), -1, int(recv[b]))
        if not (capped or every_pair):
            # every other rank at once: its samples sorted by (rank, w on top + w on it); for sample i
            # of top and rank r, new(i, j) = max(A_i + w_top(j), B_ir - w_r(j)), A_i = Lt - w_top(i),
            # B_ir = L_r + w_r(i): the first term grows and the second falls with j's size, so the
            # best j of r is next to where w_top(j) + w_r(j) crosses B_ir - A_i
            if k - 1 > SWAP_RANKS * inst.d and not every_rank:
                near = np.zeros(k, dtype=bool)
                for m in (members if members is not None else [np.arange(k)]):
                    if len(m) > SWAP_RANKS + 1:
                        m = m[np.argpartition(loads[m], SWAP_RANKS)[:SWAP_RANKS + 1]]
                    near[m] = True
                near[top] = False
                others = np.flatnonzero(near[own])
            else:
                others = np.flatnonzero(own != top)
            if len(others):
                ro = own[others]
                key = ro * S + cols[others, ct] + cols[others, rc[ro]]
                srt = np.argsort(key, kind="stable")
                others, key = others[srt], key[srt]
                seg = np.searchsorted(ro[srt], np.arange(k + 1))
                R = np.flatnonzero(seg[1:] > seg[:-1])
                A = Lt - wt
                crR = rc[R]
                Bm = loads[R][None, :] + cols[here][:, crR]
                pos = np.searchsorted(key, R[None, :] * S + np.clip(Bm - A[:, None], 0, S - 1), side="left")
                lo_s, hi_s = seg[R][None, :], seg[R + 1][None, :] - 1
                sw_best, sw_at = None, None
                for cand in (pos - 1, pos):
                    j = others[np.clip(cand, lo_s, hi_s)]
                    new = np.maximum(A[:, None] + cols[j, ct], Bm - cols[j, crR[None, :]])
                    f = int(np.argmin(new))
                    if sw_best is None or new.flat[f] < sw_best:
                        a_, b_ = divmod(f, len(R))
                        sw_best, sw_at = int(new.flat[f]), (int(here[a_]), int(j[a_, b_]), int(R[b_]))
                if sw_best is not None and sw_best < Lt:
                    c = (sw_best, 1) + sw_at
                    best = c if best is None or c < best else best
        else:  # every pair of every rank (caps can rule out the bisection's pick)
            for r in range(k):
                if r == top:
                    continue
                there = np.flatnonzero(own == r)
                if len(there) == 0:
                    continue
                cr = int(rc[r])
                Lr = int(loads[r])
                new = np.maximum(Lt - wt[:, None] + cols[there, ct][None, :],
                                 Lr - cols[there, cr][None, :] + cols[here, cr][:, None])
                if capped:
                    dt = tk[here][:, None] - tk[there][None, :]
                    ok = (toks[r] + dt <= cap[r]) & (toks[top] - dt <= cap[top])
                    new = np.where(ok, new, big)
                a_, b_ = divmod(int(np.argmin(new)), len(there))
                if new[a_, b_] < Lt:
                    c = (int(new[a_, b_]), 1, int(here[a_]), int(there[b_]), r)
                    best = c if best is None or c < best else best
        if best is None:
            break
        _, kind, i, j, r = best
        own[i] = r
        loads[top] -= cols[i, ct]
        loads[r] += cols[i, rc[r]]
        if capped:
            toks[top] -= tk[i]
            toks[r] += tk[i]
        if kind == 1:
            own[j] = top
            loads[r] -= cols[j, rc[r]]
            loads[top] += cols[j, ct]
            if capped:
                toks[r] -= tk[j]
                toks[top] += tk[j]
    return own.tolist()


def ls_rounds(n: int, k: int) -> int:
    """The pairs phase's default step budget: min(4N + 8, 64) (a step trades in every pair)."""
    return min(4 * n + 8, 64)


def seq_rounds(n: int, k: int) -> int:
    """The single-rank phase's default step budget: min(4N + 8, 2K + 64), each rank reaching the
    top about twice; a step's work is O(N + K)."""
    return min(4 * n + 8, 2 * k + 64)


def improve(inst: Instance, owner: Sequence[int], max_rounds: int | None = None, lower: int = 0,
            gap: float = 0.0) -> list[int]:
    """Local search from `owner` (`_improve_pairs`, then `_improve_seq`; on batches of at most
    `EXHAUSTIVE_CELLS` samples x ranks, unless that already reached the goal, also `_improve_seq`
    over every pair from `owner`, the better of the two): stops once the slowest rank is within
    `gap` of `lower` (a lower bound), when no step improves, or after `max_rounds` steps of each
    phase (default `ls_rounds`, `seq_rounds`). Each accepted step lowers the load of a rank at or
    above the others it trades with, so it never raises the makespan."""
    own = list(owner)
    if inst.n == 0 or inst.k < 2:
        return own
    fast = own
    if all(c is None for c in inst.caps):
        fast = _improve_pairs(inst, own, max_rounds, lower, gap)
    fast = _improve_seq(inst, fast, max_rounds, lower, gap)
    m = int(loads_np(inst, fast).max())
    if inst.n * inst.k > EXHAUSTIVE_CELLS or m <= lower or m - lower <= gap * m:
        return fast
    # small batches: also today's search (every pair of every rank, from the same start), the better
    rounds = max_rounds if max_rounds is not None else 4 * inst.n + 8
    full = _improve_seq(inst, own, rounds, lower, gap, every_pair=True)
    return min((fast, full), key=lambda o: (int(loads_np(inst, o).max()), o is full))


def improve_wide(inst: Instance, owner: Sequence[int], lower: int = 0, gap: float = 0.0, stop=None) -> list[int]:
    """The single-rank local search with swaps against every rank and a step budget of
    min(4N + 8, 8K + 64): for batches where the fast search and MULTIFIT both end above
    `loading.balance.MULTIFIT_GAP` (balance's last resort before the exact stage). `stop()`,
    asked before every step, ends it early when true."""
    if inst.n == 0 or inst.k < 2:
        return list(owner)
    return _improve_seq(inst, owner, min(4 * inst.n + 8, 8 * inst.k + 64), lower, gap, every_rank=True, stop=stop)


def _improve_pairs(inst: Instance, owner: Sequence[int], max_rounds: int | None, lower: int, gap: float) -> list[int]:
    """Rounds of simultaneous exchanges, no caps: the ranks above the goal (the largest makespan
    within `gap` of `lower`), most loaded first, are paired with the least loaded ones, and each
    pair takes its best move (count rule permitting) or swap, found by bisection as in
    `_improve_seq`, when it lowers the pair's larger load. Pairs are disjoint, so one round is a
    handful of array operations whatever K. A round without any trade shifts the pairing by one
    low rank; `PAIR_PATIENCE` such rounds in a row end the phase."""
    n, k = inst.n, inst.k
    cols, rc = inst.cols, inst.rank_cols
    own = np.array(owner, dtype=np.int64)
    loads = loads_np(inst, own)
    goal = int(lower / (1.0 - gap)) if gap < 1 else lower
    S = 1 << 24  # > any v = w_t + w_r (weights ≤ 2**WEIGHT_BITS)
    idx = np.arange(n)
    idle = 0  # rounds in a row without an accepted trade
    for t in range(max_rounds if max_rounds is not None else ls_rounds(n, k)):
        by = np.argsort(-loads, kind="stable")
        nhi = int((loads > max(goal, lower)).sum())
        npair = min(nhi, k - nhi)
        if npair == 0 or idle >= PAIR_PATIENCE:
            break
        hi_r = by[:npair]
        # the least loaded first; after a round without trades, each high rank meets the next one
        lo_r = by[::-1][:k - nhi][(np.arange(npair) + idle) % (k - nhi)]
        pair = np.full(k, -1, dtype=np.int64)
        side = np.zeros(k, dtype=np.int8)
        pair[hi_r] = np.arange(npair)
        pair[lo_r] = np.arange(npair)
        side[hi_r] = 1
        ct_p, cr_p = rc[hi_r], rc[lo_r]
        Lt_p, Lr_p = loads[hi_r], loads[lo_r]
        po = pair[own]
        si = side[own]
        # the low ranks' samples, sorted by (pair, w on the high rank + w on the low rank)
        lo_items = idx[(po >= 0) & (si == 0)]
        lp = po[lo_items]
        v = cols[lo_items, ct_p[lp]] + cols[lo_items, cr_p[lp]]
        srt = np.argsort(lp * S + v, kind="stable")
        lo_items, lp, v = lo_items[srt], lp[srt], v[srt]
        keys = lp * S + v
        seg = np.searchsorted(lp, np.arange(npair + 1))
        # the high ranks' samples
        hi_items = idx[(po >= 0) & (si == 1)]
        hp = po[hi_items]
        ct, cr = ct_p[hp], cr_p[hp]
        A = Lt_p[hp] - cols[hi_items, ct]
        B = Lr_p[hp] + cols[hi_items, cr]
        big = np.iinfo(np.int64).max // 4
        best = np.maximum(A, B) if not inst.equal_counts else np.full(len(hi_items), big)
        partner = np.full(len(hi_items), -1, dtype=np.int64)
        s0, s1 = seg[hp], seg[hp + 1]
        has = s1 > s0
        if len(lo_items) and has.any():
            pos = np.searchsorted(keys, hp * S + np.clip(B - A, 0, S - 1), side="left")
            for cand in (pos - 1, pos):
                c = np.clip(cand, s0, np.maximum(s1 - 1, s0))
                c = np.minimum(c, len(lo_items) - 1)
                j = lo_items[c]
                new = np.maximum(A + cols[j, ct], B - cols[j, cr])
                better = has & (new < best)
                best = np.where(better, new, best)
                partner = np.where(better, j, partner)
        # per pair: the smallest new load (then the lowest sample)
        o = np.lexsort((hi_items, best, hp))
        first = o[np.r_[True, hp[o][1:] != hp[o][:-1]]]
        take = first[best[first] < Lt_p[hp[first]]]
        if len(take) == 0:
            idle += 1
            continue
        idle = 0
        i, j, p = hi_items[take], partner[take], hp[take]
        t, r = hi_r[p], lo_r[p]
        own[i] = r
        sw = j >= 0
        own[j[sw]] = t[sw]
        loads = loads_np(inst, own)
    return own.tolist()
