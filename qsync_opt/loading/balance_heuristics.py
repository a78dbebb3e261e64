"""The balance heuristics: speed-aware LPT and Karmarkar-Karp, a local search that refines an
assignment (`improve`), and stride and KK partitions. Pure and deterministic (stable tie-breaks on
index); loading.balance takes the better of them as the exact program's warm start and fallback."""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from qsync_opt.loading.balance_model import Instance, feasible, loads_of, make_instance


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
