"""A plan's baselines as plans of their own, so that each can be trained side by side with the plan.

Every Baseline in a Plan carries its precision map and local batches; `baseline_plan` swaps
them into a copy of the plan (the per-group predicted figures are the baseline's where it
has them: indicator, iteration time; the rest are the plan's and say so in a note).
"""

from __future__ import annotations

import difflib

from qsync_opt.errors import SpecError
from qsync_opt.plan import Plan


def baseline_plan(plan: Plan, name: str) -> Plan:
    """`plan` with baseline `name`'s precisions and local batches, ready for `apply_plan` / `train`."""
    if name not in plan.baselines:
        near = difflib.get_close_matches(name, list(plan.baselines), n=3, cutoff=0.3)
        raise SpecError(f"baseline {name!r} is not in the plan; baselines: {', '.join(plan.baselines)}"
                        + (f" (did you mean {', '.join(map(repr, near))}?)" if near else ""))
    b = plan.baselines[name]
    if not b.precisions:
        raise SpecError(f"baseline {name!r} carries no precision map (a plan written before they were recorded); re-solve")
    groups = {}
    for g, gp in plan.groups.items():
        groups[g] = gp.model_copy(update={
            "precisions": dict(b.precisions[g]),
            "local_batch": b.local_batches.get(g, gp.local_batch),
            "indicator": b.group_indicator.get(g, gp.indicator),
            "peak_memory_bytes": b.peak_memory_bytes.get(g, gp.peak_memory_bytes),
        })
    solver = plan.solver.model_copy(update={
        "backend": f"baseline: {name}", "status": "heuristic", "objective": b.indicator, "best_bound": None, "gap": None,
        "notes": [f"baseline {name!r} of the plan; per-group compute/comm/iteration figures are the plan's, "
                  f"the baseline's synchronous iteration is {b.iteration_ms:.3f} ms"]})
    return plan.model_copy(update={"groups": groups, "iteration_ms": b.iteration_ms, "indicator": b.indicator,
                                   "solver": solver, "baselines": {}})
