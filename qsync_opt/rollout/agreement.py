"""Does the simulator rank the policies as the real run does? Paired over interleaved rounds.

The real run measures every variant once per round, round after round (`ray_run.run_rounds`), so a drift of the
machine's load falls on all variants of a round alike. Comparing each variant's median over rounds throws that
pairing away: two variants whose medians sit 4% apart can have round ranges that overlap by a factor of 1.6. Here
each round's throughputs are divided by that round's geometric mean over the variants (`round_normalised`), and a
pair is judged by how many rounds it won (`pair_wins`).

The simulator's ranking and the real one agree when no pair is ordered oppositely (`discordant`). Variants the
simulator predicts exactly alike (the same schedule: no repack happened, so repack-best-fit and repack-program
ran trajectory-async's) are tied in the prediction and constrain nothing; Kendall's tau-b (`kendall_tau_b`) counts
such ties as neither agreement nor disagreement.

A discordant pair is not yet a wrong prediction: two variants a few percent apart trade places from round to
round. `ratio_interval` bounds the median over rounds of one variant's per-round ratio to the other's with the
sign test's order statistics (distribution-free: it assumes only that rounds are independent), and a discordant
pair is `resolved` when that interval excludes 1: the real run orders the pair at that confidence.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

TIE_REL = 1e-9
"""Predicted figures closer than this (relative) are the same schedule's, not a prediction of an order."""


def normalised_rounds(rounds: dict[str, list[float]]) -> dict[str, list[float]]:
    """Variant -> per round, its throughput / that round's geometric mean over every variant."""
    n = _rounds(rounds)
    g = [math.exp(statistics.fmean(math.log(xs[i]) for xs in rounds.values())) for i in range(n)]
    return {v: [x / g[i] for i, x in enumerate(xs)] for v, xs in rounds.items()}


def round_normalised(rounds: dict[str, list[float]]) -> dict[str, float]:
    """Variant -> median over rounds of its round-normalised throughput (`normalised_rounds`)."""
    return {v: statistics.median(xs) for v, xs in normalised_rounds(rounds).items()}


def pair_wins(rounds: dict[str, list[float]], a: str, b: str) -> int:
    """In how many rounds `a` measured more than `b`."""
    return sum(x > y for x, y in zip(rounds[a], rounds[b]))


@dataclass(frozen=True)
class Discordant:
    higher_predicted: str
    lower_predicted: str
    predicted_ratio: float
    """higher / lower, as the simulator predicts (> 1)."""
    real_ratio: float
    """The same pair's round-normalised ratio measured (< 1: the real run orders it the other way)."""
    wins: int
    """Rounds in which the predicted-higher variant measured more."""
    rounds: int
    interval: tuple[float, float] = (0.0, math.inf)
    """`ratio_interval` of higher / lower: where the median per-round ratio lies, at `confidence`."""
    confidence: float = 0.0

    @property
    def resolved(self) -> bool:
        """The real run orders this pair (the interval excludes 1): the prediction is wrong, not within noise."""
        return self.interval[1] < 1.0 or self.interval[0] > 1.0


def discordant(predicted: dict[str, float], rounds: dict[str, list[float]]) -> list[Discordant]:
    """Pairs the simulator orders one way and the real run (round-normalised medians) the other, most predicted first."""
    real = round_normalised(rounds)
    n = _rounds(rounds)
    out = []
    names = sorted(rounds)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            hi, lo = (a, b) if predicted[a] >= predicted[b] else (b, a)
            if figures_tied(predicted[hi], predicted[lo]) or real[hi] >= real[lo]:
                continue
            lo_r, hi_r, conf = ratio_interval(rounds, hi, lo)
            out.append(Discordant(hi, lo, predicted[hi] / predicted[lo], real[hi] / real[lo],
                                  pair_wins(rounds, hi, lo), n, (lo_r, hi_r), conf))
    return sorted(out, key=lambda d: -d.predicted_ratio)


def ratio_interval(rounds: dict[str, list[float]], a: str, b: str, confidence: float = 0.95) -> tuple[float, float, float]:
    """(low, high, achieved confidence): an interval for the median over rounds of a's throughput / b's in the same
    round, from the order statistics x(k) <= median <= x(n + 1 - k) with the largest k whose coverage
    1 - 2 P(Binomial(n, 1/2) <= k - 1) is at least `confidence` (exact, distribution-free). Fewer than 6 rounds
    cannot reach 95%: then k = 1 (the whole range) and its lower coverage is returned."""
    n = _rounds(rounds)
    x = sorted(p / q for p, q in zip(rounds[a], rounds[b]))
    k, cover = 1, _sign_cover(n, 1)
    while k + 1 <= (n + 1) // 2 and _sign_cover(n, k + 1) >= confidence:
        k += 1
        cover = _sign_cover(n, k)
    return x[k - 1], x[n - k], cover


def _sign_cover(n: int, k: int) -> float:
    """P(x(k) <= median <= x(n + 1 - k)) for n independent draws of a continuous variable."""
    return 1.0 - 2.0 * sum(math.comb(n, i) for i in range(k)) / 2.0 ** n


def ordered_pairs(predicted: dict[str, float], rounds: dict[str, list[float]],
                  confidence: float = 0.95) -> tuple[int, int]:
    """(pairs the real run orders, of those the ones the simulator orders the same way): a pair is ordered when
    `ratio_interval` excludes 1; one the simulator predicts tied counts as not the same way."""
    names = sorted(rounds)
    ordered = same = 0
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            lo, hi, _ = ratio_interval(rounds, a, b, confidence)
            if lo <= 1.0 <= hi:
                continue
            ordered += 1
            same += _sign(predicted[a], predicted[b]) == (1 if lo > 1.0 else -1)
    return ordered, same


def kendall_tau_b(x: dict[str, float], y: dict[str, float]) -> float:
    """Kendall's tau-b between two scorings of the same names (1: the same order; ties in either count for neither)."""
    names = sorted(x)
    conc = disc = tx = ty = 0
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            dx, dy = _sign(x[a], x[b]), _sign(y[a], y[b])
            if dx == 0 and dy == 0:
                continue
            if dx == 0:
                tx += 1
            elif dy == 0:
                ty += 1
            elif dx == dy:
                conc += 1
            else:
                disc += 1
    denom = math.sqrt((conc + disc + tx) * (conc + disc + ty))
    return (conc - disc) / denom if denom else 1.0


def _sign(a: float, b: float) -> int:
    return 0 if figures_tied(a, b) else (1 if a > b else -1)


def figures_tied(a: float, b: float) -> bool:
    """Are two predicted figures the same schedule's (within TIE_REL), not an order?"""
    return abs(a - b) <= TIE_REL * max(abs(a), abs(b))


def _rounds(rounds: dict[str, list[float]]) -> int:
    counts = {len(xs) for xs in rounds.values()}
    if len(counts) != 1 or not counts.pop():
        raise ValueError(f"every variant needs the same number of rounds (> 0); got {({v: len(xs) for v, xs in rounds.items()})}")
    return len(next(iter(rounds.values())))
