"""Each rank's cost curve and speed from its device group's plan, as plain numbers.

A group's plan predicts its compute time per iteration (`compute_ms`: forward, backward,
casts and optimizer at its precisions, from the profile or the roofline) for `local_batch`
samples of the traced sequence length L₀. The FLOPs of that batch under the FLOP curve
c(L) = a·L + b·L² (`loading.cost.from_module`) are local_batch·c(L₀), so the group runs
s_g = compute_ms / (local_batch·c(L₀)) seconds per FLOP, and a sample of L tokens costs its
ranks c_g(L) = s_g·c(L) seconds. The speed of a group is min_g s_g / s_g (the fastest 1.0).

Modelled, and said so in the plan: the FLOP curve's split between the L and L² terms is the
FLOP count's, not a measured fit per length (use `cost.fit` where forward+backward was timed
at several lengths), and the optimizer's share of compute_ms (independent of L) is spread over
the samples.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from qsync_opt.errors import SpecError
from qsync_opt.loading.cost import CostModel


@dataclass(frozen=True)
class GroupSpeed:
    name: str
    count: int
    seconds_per_flop: float
    speed: float
    cost: CostModel
    """c_g(L) in seconds."""


def group_speeds(flops: CostModel, groups: Sequence[tuple[str, int, int, float]], ref_len: int) -> list[GroupSpeed]:
    """(name, count, local_batch, compute_ms) per group -> each group's seconds per FLOP, speed and c_g(L)."""
    if not groups:
        raise SpecError("rank speeds: no device groups")
    if not (isinstance(ref_len, int) and ref_len >= 1):
        raise SpecError(f"rank speeds: the reference sequence length must be an integer >= 1, got {ref_len!r}")
    per_sample = flops(ref_len)
    if not per_sample > 0:
        raise SpecError("rank speeds: the FLOP curve gives no work for a sample; the model has no linear layers")
    spf = []
    for name, count, batch, compute_ms in groups:
        if batch < 1 or not compute_ms > 0:
            raise SpecError(f"rank speeds: group {name!r} has local_batch {batch} and compute_ms {compute_ms}; "
                            "both must be positive to derive its speed")
        spf.append(compute_ms / 1e3 / (batch * per_sample))
    fastest = min(spf)
    return [GroupSpeed(name, int(count), s, fastest / s,
                       CostModel(a=flops.a * s, b=flops.b * s, c0=flops.c0 * s, unit="s"))
            for (name, count, _b, _c), s in zip(groups, spf)]


def per_rank(groups: Sequence[GroupSpeed]) -> tuple[list[float], list[CostModel]]:
    """Speeds and cost curves in rank order (ranks numbered group by group, as the cluster lists them)."""
    speeds, costs = [], []
    for g in groups:
        speeds += [g.speed] * g.count
        costs += [g.cost] * g.count
    return speeds, costs
