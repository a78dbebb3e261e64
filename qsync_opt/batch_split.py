"""Local batch sizes chosen jointly with precision (`training.batch_split: auto`).

Splits are enumerated outside the integer program. Inside it, a group's time would be a
product of its batch and its precision choices (bilinear), and the 'auto' bound itself moves
with the training groups' batch; outside, every candidate is an ordinary instance that the
exact backends solve in well under a second, and the candidate list is short (a grid of
per-device batches summing to the global batch). The bound stays the one of the even split,
so all candidates are judged against the same target and the comparison is fair.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from .errors import InfeasibleError, SolverError
from .plan import Baseline
from .spec import JobSpec

MAX_CANDIDATES = 48


@dataclass
class Split:
    spec: JobSpec
    """The spec with the bound made explicit (and training groups pinned) for the chosen split."""
    local_batches: dict[str, int]
    notes: list[str] = field(default_factory=list)
    baselines: dict[str, Baseline] = field(default_factory=dict)


def candidate_splits(spec: JobSpec, granularity: int | None = None) -> list[dict[str, int]]:
    """Per-device batches on a grid, one per group, with Σ count·batch = global batch."""
    groups = spec.cluster.groups
    total = spec.training.global_batch
    q = granularity or max(1, total // (spec.cluster.world_size * 8))
    ranges = []
    for g in groups[:-1]:
        hi = (total - sum(h.count for h in groups if h is not g)) // g.count
        ranges.append(range(q, hi + 1, q))
    last = groups[-1]
    out = []
    for head in itertools.product(*ranges):
        rest = total - sum(b * g.count for b, g in zip(head, groups))
        if rest >= last.count and rest % last.count == 0:
            out.append({**{g.name: b for b, g in zip(head, groups)}, last.name: rest // last.count})
    even = spec.local_batches()
    if even not in out:
        out.append(even)
    if len(out) > MAX_CANDIDATES:
        step = len(out) / MAX_CANDIDATES
        out = [out[int(i * step)] for i in range(MAX_CANDIDATES)] + [even]
    return out


def choose_split(spec: JobSpec, prepared, budget=None) -> Split:
    """The split whose best plan has the lowest objective; ties go to the faster iteration.

    Every candidate's solve draws on `budget`; candidates left when it runs out are skipped,
    and the notes say how many were tried."""
    from .pipeline import _as_baseline, resolve_budget, run_backend
    from .predictor.instance_builder import baseline, build_instance
    from .solver.budget import Budget

    budget = budget or Budget(spec.solver.time_limit_s)

    graph, sens, boundary = prepared.graph, prepared.sensitivity, spec.runtime.boundary
    even = spec.local_batches()
    _, ctx = build_instance(spec, graph, sens, local_batches=even, boundary=boundary)
    pinned = {
        "objective": {**spec.objective.model_dump(), "max_iteration_time": ctx.time_bound_ms}
        if ctx.time_bound_ms is not None else spec.objective.model_dump(),
        "cluster": {
            **spec.cluster.model_dump(mode="json", by_alias=True),
            "groups": [
                {**g.model_dump(mode="json", by_alias=True), "local_batch": None,
                 "role": "training" if g.name in ctx.training_groups else g.role}
                for g in spec.cluster.groups
            ],
        },
    }
    fixed = spec.model_validate({**spec.model_dump(mode="json", by_alias=True), **pinned})

    best, best_key, batch_only, tried = None, None, None, 0
    splits = candidate_splits(spec)
    for split in splits:
        if budget.exhausted:
            break
        tried += 1
        inst, c = build_instance(fixed, graph, sens, local_batches=split, boundary=boundary)
        inst = resolve_budget(fixed, inst)
        hi = _as_baseline(inst, c, baseline(inst, "highest"))
        if hi.feasible and (batch_only is None or hi.iteration_ms < batch_only[1].iteration_ms):
            batch_only = (split, hi)
        try:
            r = run_backend(fixed, inst, budget)
        except (InfeasibleError, SolverError):
            continue
        key = (round(r["objective"], 12), _as_baseline(inst, c, r["assignment"]).iteration_ms)
        if best_key is None or key < best_key:
            best, best_key = split, key
    if best is None:
        raise InfeasibleError(
            "batch_split: auto: no candidate split of the global batch has a plan within the bounds",
            [f"tried {len(candidate_splits(spec))} splits, e.g. the even split {even}"],
        )
    notes = [f"batch_split auto: chose {best} over the even split {even} (bound fixed at the even split's)"]
    if tried < len(splits):
        notes.append(f"batch_split auto: the time limit allowed {tried} of {len(splits)} candidate splits")
    baselines = {}
    if batch_only is not None:
        baselines[f"dynamic batching alone {batch_only[0]}"] = batch_only[1]
    return Split(spec=fixed, local_batches=best, notes=notes, baselines=baselines)
