"""The simplest sound policy: one precision per device group, the highest that meets its bounds.

It is what a cluster operator does by hand ("run the T4s in FP16"), so it is the baseline
every other backend must beat, and the fallback that needs no solver at all.
"""

from __future__ import annotations

from qsync_opt.errors import InfeasibleError
from qsync_opt.precision import rank
from qsync_opt.solver.instance import Assignment, GroupInstance, TrainingInstance, evaluate


def uniform_assignment(g: GroupInstance, precision: str) -> dict[str, str]:
    """`precision` wherever allowed; elsewhere the op's nearest allowed precision below it (else above)."""
    out = {}
    for op, ps in g.allowed.items():
        below = [p for p in ps if rank(p) >= rank(precision)]
        out[op] = below[0] if below else ps[-1]
    return out


def uniform_policy(instance: TrainingInstance) -> Assignment:
    """Per group, the highest uniform precision whose plan meets that group's time and memory bounds."""
    plan: Assignment = {}
    for g in instance.groups:
        levels = sorted({p for ps in g.allowed.values() for p in ps}, key=rank)
        chosen = None
        for p in levels:
            candidate = uniform_assignment(g, p)
            sub = TrainingInstance(groups=(g,), omega=instance.omega)
            if evaluate(sub, {g.name: candidate}).feasible:
                chosen = candidate
                break
        if chosen is None:
            raise InfeasibleError(
                f"{g.name}: no uniform precision meets its bounds (tried {', '.join(levels)})",
                ["use an exact backend (e.g. --backend highs) for a per-operator diagnosis"],
            )
        plan[g.name] = chosen
    return plan
