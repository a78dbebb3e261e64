"""Exact minimisation of a one-group, pairwise cost over a path decomposition (chains, narrow DAGs).

With the time and memory rows moved into the objective (lagrange.py), one group's program is
min Σ_i u[i, x_i] + Σ_(a,b) w[(a,b), x_a, x_b] over one precision per op: an energy on the
cast graph. Ops are taken in their order; op a stays "open" from its own step to its last
neighbour's step. Bag i holds op i and the ops still open, so every cast edge lies in one bag,
and a dynamic programme over bags is exact with cost n · P^(bag size). A chain has bags of
two ops; the synthetic DAG (skip edges of length ≤ 4) at most five.

Every table carries a leading batch axis: K multiplier settings are minimised in one pass,
which costs little more than one, since per-op numpy overhead dominates at these sizes.
Disallowed precisions have cost +inf (padded to the group's widest op).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Chainlike:
    """A group's ops and cast edges as padded arrays (positions are the ops' order)."""

    n: int
    width: int
    """Largest number of allowed precisions of any op (P)."""
    edges: np.ndarray
    """(E, 2) positions (a, b) with a < b."""
    bags: tuple[tuple[int, ...], ...]
    """bags[i]: sorted positions in bag i (op i last)."""
    closes: tuple[tuple[int, ...], ...]
    """closes[i]: positions whose last bag is i (eliminated after step i)."""
    into: tuple[tuple[int, ...], ...]
    """into[i]: edge indices (a, i) that end at op i, summed in bag i."""

    @property
    def largest_table(self) -> int:
        return max(self.width ** len(b) for b in self.bags)

    def pass_seconds(self, batch: int) -> float:
        """Rough time of one DP pass and decode: per-op numpy overhead plus table work per table
        entry and batch entry (constants above the measured costs: docs/program.md)."""
        return 6e-5 * self.n + 4e-8 * batch * sum(self.width ** len(b) for b in self.bags)


def decomposition(n: int, width: int, edges: np.ndarray) -> Chainlike:
    last = np.arange(n)
    for a, b in edges:
        last[a] = max(last[a], b)
    bags, closes, into = [], [[] for _ in range(n)], [[] for _ in range(n)]
    open_: list[int] = []
    for e, (a, b) in enumerate(edges):
        into[b].append(e)
    for i in range(n):
        open_.append(i)
        bags.append(tuple(open_))
        closes[i] = [a for a in open_ if last[a] == i]
        open_ = [a for a in open_ if last[a] > i]
    return Chainlike(n, width, edges, tuple(bags), tuple(map(tuple, closes)), tuple(map(tuple, into)))


def _shape(have, into: tuple[int, ...], width: int) -> tuple[int, ...]:
    """Shape (without the batch axis) of a table over `have` seen inside `into` (singleton elsewhere)."""
    return tuple(width if op in have else 1 for op in into)


@dataclass(frozen=True)
class _Step:
    """Precomputed shapes and axes of bag i, so a pass does no Python list work per op."""

    msg: tuple[int, ...]
    unary: tuple[int, ...]
    pairs: tuple[tuple[int, tuple[int, ...]], ...]
    perm: tuple[int, ...]
    """Batch axis, then kept ops, then the ops closed at this step."""
    kept: int
    """Entries over the kept ops (the next message's size)."""
    closed_shape: tuple[int, ...]
    kept_ops: tuple[int, ...]
    closed_ops: tuple[int, ...]
    sep_in_prev: tuple[int, ...]
    """Shape of the backward message over bag i minus op i, inside bag i − 1."""


def steps(d: Chainlike) -> list[_Step]:
    out, w = [], d.width
    for i, bag in enumerate(d.bags):
        kept_ops = tuple(a for a in bag if a not in d.closes[i])
        closed = d.closes[i]
        perm = (0, *(1 + bag.index(a) for a in kept_ops + closed))
        out.append(_Step(
            msg=_shape(set(bag) - {i}, bag, w), unary=_shape({i}, bag, w),
            pairs=tuple((e, _shape({int(d.edges[e, 0]), i}, bag, w)) for e in d.into[i]),
            perm=perm, kept=w ** len(kept_ops), closed_shape=(w,) * len(closed),
            kept_ops=kept_ops, closed_ops=closed,
            sep_in_prev=_shape(set(bag) - {i}, d.bags[i - 1], w) if i else ()))
    return out


class Energy:
    """u (K, n, P) unary and w (K, E, P, P) pairwise costs on a Chainlike."""

    def __init__(self, d: Chainlike, unary: np.ndarray, pair: np.ndarray, plan: list[_Step] | None = None):
        self.d, self.u, self.w = d, unary, pair
        self.k = unary.shape[0]
        self.plan = plan if plan is not None else steps(d)

    def _bag_table(self, i: int, msg: np.ndarray | None) -> np.ndarray:
        s, k = self.plan[i], self.k
        t = self.u[:, i, :].reshape((k, *s.unary))
        if msg is not None:
            t = t + msg.reshape((k, *s.msg))
        for e, shape in s.pairs:
            t = t + self.w[:, e].reshape((k, *shape))
        return t

    def forward(self) -> tuple[list[np.ndarray], np.ndarray, list[np.ndarray]]:
        """(messages into every bag, the minimum per batch entry, the argmin of every elimination)."""
        k = self.k
        msg = np.zeros((k,))
        msgs, picks = [], []
        for i, s in enumerate(self.plan):
            msgs.append(msg)
            t = self._bag_table(i, msg).transpose(s.perm).reshape(k, s.kept, -1)
            pick = t.argmin(axis=2)
            picks.append(pick.astype(np.int16 if t.shape[2] < 2**15 else np.int32))
            msg = t.min(axis=2)
        return msgs, msg.reshape(k), picks

    def argmin(self, picks: list[np.ndarray]) -> np.ndarray:
        """(K, n) precision indices of a minimiser for every batch entry (after forward)."""
        k, w = self.k, self.d.width
        x = np.zeros((k, self.d.n), dtype=np.int64)
        rows = np.arange(k)
        for i in range(self.d.n - 1, -1, -1):
            s = self.plan[i]
            if not s.closed_ops:
                continue
            at = np.zeros(k, dtype=np.int64)
            for a in s.kept_ops:  # row-major index of the kept ops' values
                at = at * w + x[:, a]
            flat = picks[i][rows, at].astype(np.int64)
            for a, v in zip(s.closed_ops, np.unravel_index(flat, s.closed_shape)):
                x[:, a] = v
        return x

    def min_marginals(self, msgs: list[np.ndarray]) -> np.ndarray:
        """(K, n, P): the least energy with op i at precision p, from forward and backward messages."""
        d, k = self.d, self.k
        out = np.empty((k, d.n, d.width))
        back = None
        for i in range(d.n - 1, -1, -1):
            s = self.plan[i]
            bag = d.bags[i]
            t = self._bag_table(i, None)
            if back is not None:
                t = t + back.reshape((k, *self.plan[i + 1].sep_in_prev))
            belief = t + msgs[i].reshape((k, *s.msg))
            out[:, i, :] = belief.reshape(k, -1, d.width).min(axis=1)
            back = t.min(axis=len(bag))  # op i is the last axis; the rest is bag i minus op i
        return out
