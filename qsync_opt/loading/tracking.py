"""Per-rank cost curves that follow a rank whose speed drifts during a run.

A rank's c(L) fitted once over the calibration and every step so far, all weighted alike,
keeps the average of its past: a rank that slows down (other work on its core, a clock
change, the data plane's own work beside it) stays predicted at its old speed for as long
as its old observations outnumber the new ones. `CostTracker` separates the two things a
measurement tells: the curve's shape (how cost grows with L, which drift does not change)
is fitted by `cost.fit` on all observations, and a per-rank scale, the exponentially
weighted ratio of measured to shape-predicted time over that rank's recent rounds
(half-life `half_life` rounds), carries the current speed. The curve is scale x shape.

Deterministic: the curves depend only on the observations and their order.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from qsync_opt.errors import SpecError
from qsync_opt.loading.cost import CostModel, fit


class CostTracker:
    """Each rank's cost curve c_r(L) in seconds, refitted from its measured samples.

    `calibration[r]`: (length, seconds) pairs measured before the run (at least two lengths).
    `observe(per_rank)`: one round (a step), per rank the (length, seconds) of its samples.
    `curves()`: scale_r x shape_r for every rank.
    """

    def __init__(self, calibration: Sequence[Sequence[tuple[float, float]]], *, half_life: float = 4.0,
                 window: int | None = None):
        if not half_life > 0 or not math.isfinite(half_life):
            raise SpecError(f"cost tracker: half_life must be a positive number of rounds, got {half_life!r}")
        self.half_life = float(half_life)
        self.window = int(window) if window is not None else max(1, math.ceil(12 * self.half_life))
        """Rounds kept for the scale; older ones weigh under 2**-12 and are dropped."""
        self._L = [[float(L) for L, _ in cal] for cal in calibration]
        self._t = [[float(t) for _, t in cal] for cal in calibration]
        self._rounds: list[list[tuple[float, float, float, float]]] = [[] for _ in self._L]
        """Per rank and round: (samples, Σ L, Σ L², measured seconds): all the scale needs."""
        self._shapes: list[CostModel | None] = [None] * len(self._L)
        for r in range(len(self._L)):
            self.shape(r)

    @property
    def ranks(self) -> int:
        return len(self._L)

    def observe(self, per_rank: Sequence[Sequence[tuple[float, float]]]) -> None:
        if len(per_rank) != self.ranks:
            raise SpecError(f"cost tracker: {len(per_rank)} ranks observed, {self.ranks} tracked")
        for r, samples in enumerate(per_rank):
            Ls = [float(L) for L, _ in samples]
            ts = [float(t) for _, t in samples]
            self._rounds[r].append((float(len(Ls)), sum(Ls), sum(x * x for x in Ls), sum(ts)))
            del self._rounds[r][:-self.window]
            if Ls:
                self._L[r] += Ls
                self._t[r] += ts
                self._shapes[r] = None  # refitted when next asked for

    def shape(self, r: int) -> CostModel:
        """Rank r's c(L) fitted on all its observations, calibration included, weighted alike."""
        if self._shapes[r] is None:
            self._shapes[r] = fit(self._L[r], self._t[r])
        return self._shapes[r]

    def scale(self, r: int) -> float:
        """Σ_j w_j·measured_j / Σ_j w_j·shape(L_j) over rank r's kept rounds, w_j = 2^(-age_j / half_life);
        1.0 before its first round with samples."""
        shape = self.shape(r)
        num = den = 0.0
        for age, (n, s1, s2, measured) in enumerate(reversed(self._rounds[r])):
            if not n:
                continue
            w = 2.0 ** (-age / self.half_life)
            num += w * measured
            den += w * (shape.c0 * n + shape.a * s1 + shape.b * s2)
        return num / den if den > 0 else 1.0

    def curves(self) -> list[CostModel]:
        out = []
        for r in range(self.ranks):
            s, k = self.shape(r), self.scale(r)
            out.append(CostModel(a=s.a * k, b=s.b * k, c0=s.c0 * k, unit="s"))
        return out

    @staticmethod
    def speeds_of(curves: Sequence[CostModel], lengths: Sequence[int]) -> list[float]:
        """Relative speeds of these curves on these lengths (the fastest 1.0): they order ranks
        for Karmarkar-Karp and weight the balancer's lower bound."""
        n, s1, s2 = float(len(lengths)), float(sum(lengths)), float(sum(x * x for x in lengths))
        totals = [c.c0 * n + c.a * s1 + c.b * s2 for c in curves]
        return [min(totals) / t for t in totals]

    def speeds(self, lengths: Sequence[int]) -> list[float]:
        return self.speeds_of(self.curves(), lengths)
