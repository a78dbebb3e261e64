"""The balance heuristics: speed-aware LPT, MULTIFIT and Karmarkar-Karp, and stride and KK
partitions. Pure and deterministic (stable tie-breaks on index); loading.balance takes the better of
them, refined by the local search (balance_search.py), as the exact program's warm start and fallback.

LPT keeps one heap of (load, rank) per rank class (ranks sharing a weight column): the best rank
of a class for the next sample is its least loaded eligible one, so a sample costs O(d + log K)
for d classes, O(N log N + N (d + log K)) in all."""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import numpy as np

from qsync_opt.loading.balance_model import Instance, feasible, loads_np, make_instance

def stride(n: int, k: int) -> list[int]:
    """DistributedSampler's split: sample i of the batch goes to rank i mod k."""
    return [i % k for i in range(n)]


def lpt(inst: Instance) -> list[int] | None:
    """Longest processing time first onto the rank that finishes it earliest (speed-aware),
    within the caps and count rule; None when this greedy cannot place a sample. Ties go to
    the smaller (finish, load, rank): among the ranks of one class that is the least loaded
    (then lowest) eligible rank, the top of the class's heap."""
    n, k, d = inst.n, inst.k, inst.d
    if n == 0:
        return [] if feasible(inst, []) else None
    lo, hi = inst.count_range()
    extra = n - lo * k  # ranks that may hold hi samples when hi > lo
    order = inst.order
    if not inst.equal_counts and all(c is None for c in inst.caps):
        return _lpt_free(inst, order)
    ws = inst.cols[order].tolist()
    heaps: list[list[tuple[int, int]]] = [[] for _ in range(d)]
    for r, c in enumerate(inst.rank_col):
        heaps[c].append((0, r))
    for h in heaps:
        heapq.heapify(h)
    owner = [-1] * n
    pop, push = heapq.heappop, heapq.heappush
    counts, toks = [0] * k, [0] * k
    caps, tk = inst.caps, inst.tokens
    above = 0
    for i, w in zip(order.tolist(), ws):
        best, bc, aside = None, 0, []
        for c in range(d):
            h = heaps[c]
            while h:
                ld, r = h[0]
                if counts[r] >= hi or (hi > lo and counts[r] >= lo and above >= extra):
                    pop(h)  # full for good: counts only grow
                    continue
                if caps[r] is not None and toks[r] + tk[i] > caps[r]:
                    aside.append((c, pop(h)))  # may take a smaller sample later
                    continue
                key = (ld + w[c], ld, r)
                if best is None or key < best:
                    best, bc = key, c
                break
        if best is None:
            return None
        pop(heaps[bc])  # the chosen rank: still its class's top (set-aside ranks are out)
        for c, e in aside:
            push(heaps[c], e)
        r = best[2]
        if hi > lo and counts[r] == lo:
            above += 1
        owner[i] = r
        counts[r] += 1
        toks[r] += tk[i]
        push(heaps[bc], (best[0], r))
    return owner if feasible(inst, owner) else None


def _lpt_free(inst: Instance, order: np.ndarray) -> list[int]:
    """`lpt` without caps or count rule. A heap entry is one integer, load << sh | rank, so that
    integer order is (load, rank) order and a step is one comparison per class and one heap
    replacement."""
    n, d = inst.n, inst.d
    sh = max(inst.k - 1, 1).bit_length()
    mask = (1 << sh) - 1
    heaps: list[list[int]] = [[] for _ in range(d)]
    for r, c in enumerate(inst.rank_col):
        heaps[c].append(r)
    for h in heaps:
        heapq.heapify(h)
    ws = (inst.cols[order] << sh).tolist()  # weights in heap-entry units
    owner = [0] * n
    replace = heapq.heapreplace
    if d == 1:
        h = heaps[0]
        for i, (w,) in zip(order.tolist(), ws):
            e = h[0]
            replace(h, e + w)
            owner[i] = e & mask
        return owner
    if d == 2:  # the common unequal case, unrolled
        h0, h1 = heaps
        for i, (w0, w1) in zip(order.tolist(), ws):
            e0, e1 = h0[0], h1[0]
            f0, f1 = (e0 + w0) >> sh, (e1 + w1) >> sh  # finish times
            if f0 < f1 or (f0 == f1 and e0 < e1):
                replace(h0, e0 + w0)
                owner[i] = e0 & mask
            else:
                replace(h1, e1 + w1)
                owner[i] = e1 & mask
        return owner
    for i, w in zip(order.tolist(), ws):
        best, bc = None, 0
        for c in range(d):
            e = heaps[c][0]
            key = ((e + w[c]) >> sh, e)  # (finish, load, rank)
            if best is None or key < best:
                best, bc = key, c
        e = best[1]
        replace(heaps[bc], e + w[bc])
        owner[i] = e & mask
    return owner


def fit_within(inst: Instance, T: int) -> list[int] | None:
    """Best-fit decreasing into ranks of capacity T (weight units), no caps or count rule: each
    sample, largest first, goes to the rank it leaves the least idle (in its share of T; ties to
    the lowest rank); None when one does not fit anywhere. One sorted list of (room, rank) per
    rank class: a sample costs d bisections and one list update."""
    import bisect

    n, d = inst.n, inst.d
    sh = max(inst.k - 1, 1).bit_length()
    mask = (1 << sh) - 1
    rooms: list[list[int]] = [[] for _ in range(d)]
    for r, c in enumerate(inst.rank_col):
        rooms[c].append((int(T) << sh) | r)
    for lst in rooms:
        lst.sort()
    owner = [0] * n
    ws = inst.cols[inst.order].tolist()
    for i, w in zip(inst.order.tolist(), ws):
        best, bc, bj = None, -1, -1
        for c in range(d):
            lst = rooms[c]
            j = bisect.bisect_left(lst, w[c] << sh)
            if j < len(lst):
                key = ((lst[j] >> sh) - w[c], lst[j] & mask)  # idle left (weight units of this class), rank
                if best is None or key < best:
                    best, bc, bj = key, c, j
        if best is None:
            return None
        e = rooms[bc].pop(bj)
        owner[i] = e & mask
        bisect.insort(rooms[bc], e - (w[bc] << sh))  # the rank's room shrinks by the sample
    return owner


def multifit(inst: Instance, lower: int, upper: int, probes: int = 12, gap: float = 0.0,
             stop=None) -> list[int] | None:
    """MULTIFIT: bisection on the capacity T between `lower` (a lower bound) and `upper` (a known
    makespan), `fit_within` at each probe; the best assignment found (makespan < `upper`), or
    None. Stops after `probes` probes, once the interval is within `gap` of its top, or when
    `stop()` (asked before every probe) is true."""
    best = None
    lo, hi = int(lower) - 1, int(upper)  # no plan fits lo; one fits hi (the known makespan)
    for _ in range(probes):
        if hi - lo <= 1 or hi - lo <= gap * hi or (stop is not None and stop()):
            break
        mid = (lo + hi) // 2
        own = fit_within(inst, mid)
        if own is None:
            lo = mid
        else:
            best, hi = own, int(loads_np(inst, own).max())
    return best


def karmarkar_karp(inst: Instance) -> list[int]:
    """Largest differencing into k parts, speed-aware: parts are bound to ranks, a merge gives
    the most loaded rank (load/speed) of one partial solution the smallest part of the other,
    and the heap is keyed on the spread of load/speed. With equal speeds this is verl's
    `karmarkar_karp` (equal_size when counts must be equal). Caps are not enforced here.
    O(N·K log K) (a K-slot partial solution per sample): loading.balance runs it on small batches
    only (`KK_MAX_CELLS`)."""
    k, n = inst.k, inst.n
    sp = inst.speeds
    fast = sorted(range(k), key=lambda r: (-sp[r], r))

    col0 = inst.cols[:, inst.rank_col[fast[0]]].tolist()

    def base(i: int) -> float:  # rank-independent size of a sample (its cost up to a factor)
        return col0[i] * sp[fast[0]]

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


def kk_parts(costs: Sequence[float], k: int, equal_size: bool = False) -> list[int]:
    """verl's balancing, ignoring rank speeds: KK on the given costs into k equal-speed parts."""
    return karmarkar_karp(make_instance(costs, [1.0] * k, equal_counts=equal_size))
