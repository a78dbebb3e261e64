"""Local batch sizes chosen jointly with precision (`training.batch_split: auto`).

Splits are enumerated outside the integer program. Inside it, a group's time would be a
product of its batch and its precision choices (bilinear), and the 'auto' bound itself moves
with the training groups' batch; outside, every candidate is an ordinary instance that the
exact backends solve in well under a second, and the candidate list is short (a grid of
per-device batches summing to the global batch).

What is optimised (the definition `choose_split` implements and the tests check by brute force):

* Each split s on the grid is the instance the spec would give with s as its local batches.
  The bound is the spec's own: with `max_iteration_time: auto` (QSync) it is the training
  groups' own all-highest iteration time *at their batch in s*, so it moves with the split;
  a number is the same bound for every split. Which groups are training groups is decided
  once, at the even split, and pinned (a role: auto group does not turn into a pace-setter
  because some split happens to balance it).
* Feasible splits are those whose instance has a plan meeting every group's bound (and memory,
  and the indicator budget). Among them the chosen one has the least objective (the plan's
  share-weighted indicator, or iteration time for minimize: iteration_time); ties go to the
  split whose plan has the lower replayed iteration time.

With the 'auto' bound a split that gives the weak groups few enough samples to keep pace at
their highest precision has indicator 0, so that is what auto picks when the grid holds one
(the fastest such split); a numeric bound fixes the pace instead.

Statuses are facts: 'infeasible' only when every split on the grid was proven infeasible. When
the time limit ends the search early, the choice is the best of the splits solved and the notes
say so; when none of those was feasible, the answer is unknown (SolverError), not infeasible.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

from qsync_opt.errors import InfeasibleError, SolverError
from qsync_opt.solver.budget import Budget
from qsync_opt.training.plan import Baseline
from qsync_opt.training.spec import JobSpec
from qsync_opt.training.predictor.instance_builder import baseline, build_instance
from qsync_opt.training import solving
from qsync_opt.training.solving import as_baseline, resolve_budget

MAX_CANDIDATES = 48
RESERVE = 0.25
"""Fraction of the time limit the split search leaves for the final solve and refine rounds."""


@dataclass
class Split:
    spec: JobSpec
    """The spec with training groups pinned and local batches removed; build it at `local_batches`."""
    local_batches: dict[str, int]
    notes: list[str] = field(default_factory=list)
    baselines: dict[str, Baseline] = field(default_factory=dict)


@dataclass
class Outcome:
    """What one candidate split gave: 'feasible' (key set), 'infeasible' (proven) or 'unknown'."""

    split: dict[str, int]
    status: str
    key: tuple[float, float] | None = None
    reason: str = ""
    time_ratio: float | None = None
    """Infeasible splits: the slowest group's proven least time over its bound (solver/diagnose.py)."""
    fixes: list[str] = field(default_factory=list)


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
        out = [out[int(i * step)] for i in range(MAX_CANDIDATES)]
        if even not in out:
            out.append(even)
    return out


def pin_training_groups(spec: JobSpec, training_groups) -> JobSpec:
    """`spec` with each group's role fixed as decided at the even split and no local batch.

    The objective (the user's bound, 'auto' included) is left as it is, so every split's
    instance gets its own bound from build_instance."""
    groups = []
    for g in spec.cluster.groups:
        role = "training" if g.name in training_groups else ("inference" if g.role == "auto" else g.role)
        groups.append({**g.model_dump(mode="json", by_alias=True), "local_batch": None, "role": role})
    data = spec.model_dump(mode="json", by_alias=True)
    data["cluster"] = {**data["cluster"], "groups": groups}
    return spec.model_validate(data)


def choose_split(spec: JobSpec, prepared, budget: Budget) -> Split:
    """The feasible split with the least objective (module docstring); ties go to the faster iteration.

    Every candidate's solve draws on `budget`, leaving RESERVE of it for the final solve;
    candidates left when it runs out are not tried, and the notes say how many were."""

    graph, sens, boundary = prepared.graph, prepared.sensitivity, spec.runtime.boundary
    even = spec.local_batches()
    _, ctx = build_instance(spec, graph, sens, local_batches=even, boundary=boundary)
    fixed = pin_training_groups(spec, ctx.training_groups)
    splits = candidate_splits(spec)
    splits.sort(key=lambda s: s != even)  # the even split first: the reference every note compares with
    floor = budget.remaining() * RESERVE if math.isfinite(budget.remaining()) else 0.0

    outcomes: list[Outcome] = []
    batch_only = None
    for split in splits:
        if budget.exhausted or budget.remaining() <= floor:
            break
        inst, c = build_instance(fixed, graph, sens, local_batches=split, boundary=boundary)
        inst = resolve_budget(fixed, inst)
        hi = as_baseline(inst, c, baseline(inst, "highest"))
        if hi.feasible and (batch_only is None or hi.iteration_ms < batch_only[1].iteration_ms):
            batch_only = (split, hi)
        try:
            r = solving.run_backend(fixed, inst, budget)
        except InfeasibleError as e:
            outcomes.append(Outcome(split, "infeasible", reason="; ".join(e.diagnosis[:1]) or str(e).splitlines()[0],
                                    time_ratio=getattr(e.diagnosis, "worst_time_ratio", None),
                                    fixes=list(getattr(e.diagnosis, "fixes", []))))
            continue
        except SolverError as e:
            outcomes.append(Outcome(split, "unknown", reason=str(e).splitlines()[0]))
            continue
        key = (round(r["objective"], 12), as_baseline(inst, c, r["assignment"]).iteration_ms)
        outcomes.append(Outcome(split, "feasible", key=key))

    untried = len(splits) - len(outcomes)
    unknown = [o for o in outcomes if o.status == "unknown"]
    feasible = [o for o in outcomes if o.status == "feasible"]
    if not feasible:
        _raise_none_feasible(splits, outcomes, untried, unknown, even)
    best = min(feasible, key=lambda o: o.key)
    notes = [f"batch_split auto: chose {best.split} (even split {even}); {len(feasible)} of {len(splits)} grid "
             f"splits feasible; {_bound_words(spec)}; least objective, ties to the faster iteration"]
    if untried or unknown:
        notes.append(f"batch_split auto: the time limit allowed {len(outcomes) - len(unknown)} of {len(splits)} "
                     "candidate splits to be solved; the choice is the best of those, a better split may exist")
    baselines = {}
    if batch_only is not None:
        baselines[f"dynamic batching alone {batch_only[0]}"] = batch_only[1]
    return Split(spec=fixed, local_batches=best.split, notes=notes, baselines=baselines)


def _bound_words(spec: JobSpec) -> str:
    o = spec.objective
    if o.max_iteration_time == "auto" and o.minimize == "accuracy_degradation":
        return "bound per split = the training groups' own time at their batch in that split"
    if o.max_iteration_time == "auto":
        return "no time bound"
    return f"bound {float(o.max_iteration_time):.3f} ms for every split"


def _raise_none_feasible(splits, outcomes, untried, unknown, even) -> None:
    """Infeasible only when every grid split was proven so; otherwise the answer is unknown."""
    first = next((o for o in outcomes if o.split == even), None)
    if not untried and not unknown:
        diag = [f"all {len(splits)} splits on the grid proven infeasible"]
        if first is not None and first.reason:
            diag.append(f"e.g. the even split {even}: {first.reason}")
        rated = [o for o in outcomes if o.time_ratio is not None]
        if rated:
            best = min(rated, key=lambda o: o.time_ratio)
            diag.append(f"best split seen: {best.split}, where the slowest group's least time is "
                        f"{best.time_ratio:.3g}x its bound")
            diag.extend(f"{fix}, at the split {best.split}" for fix in best.fixes)
        raise InfeasibleError("batch_split: auto: no split of the global batch has a plan within the bounds", diag)
    proven = len(outcomes) - len(unknown)
    raise SolverError(
        f"batch_split: auto: no feasible split found within solver.time_limit_s, but the answer is unknown, "
        f"not infeasible: {proven} of {len(splits)} splits proven infeasible, {len(unknown)} unsolved, "
        f"{untried} not tried; fix: raise solver.time_limit_s, or give each group's local_batch"
    )
