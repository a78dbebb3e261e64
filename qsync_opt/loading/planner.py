"""`solve` for a loading job: the data plane (`loading.engine.LocalEngine`, the one a trainer opens) draws and
splits the job's first global batches; each split is measured against the balancer's lower bound and against an
even split by count, both from the same plane (`DataPlane.assign(..., policy="stride")`, `balance.lower_bound`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from qsync_opt.errors import InfeasibleError, QSyncError, SpecError
from qsync_opt.loading import balance as B
from qsync_opt.loading.cost import CostModel
from qsync_opt.loading.engine import LocalEngine
from qsync_opt.loading.plan import LoadingPlan, RankInfo, RankStep, StepSplit, Summary
from qsync_opt.loading.plane import SPEC_POLICY, DataPlane, StepPlan
from qsync_opt.loading.spec import LoadingJob
from qsync_opt.solver.budget import Budget

MIN_STEP_LIMIT_S = 1e-3
"""The per-step time limit once the plan's budget is spent: the deterministic heuristics still run."""


def rank_model(job: LoadingJob, lengths: Sequence[np.ndarray]) -> tuple[list[float], CostModel | list[CostModel]]:
    """The speeds and the cost the data plane takes: every rank by speed -> those speeds and the shared curve
    (divided by each); a rank with its own curve -> one curve per rank, each speed the fastest rank's seconds for
    a sample of the sources' mean length over this rank's (`lengths`: every source's sample lengths)."""
    if job.by_speed:
        return [float(r.speed) for r in job.ranks], job.plane_cost()
    costs = job.rank_costs()
    mean = float(np.concatenate([np.asarray(x, dtype=float) for x in lengths]).mean())
    t = [c(mean) for c in costs]
    return [min(t) / x for x in t], costs


def opening_sources(e: Exception) -> SpecError:
    """The error of a source whose dataset could not be made from its kwargs (a built-in source's generator
    refusing a value, or too many samples to hold)."""
    return SpecError(f"sources: a source could not be opened ({type(e).__name__}: {str(e).strip()}); check its "
                     "kwargs (`qsync-opt spec --kind loading` lists what each built-in source takes)")


def open_local(job: LoadingJob) -> tuple[LocalEngine, list[float], CostModel | list[CostModel]]:
    """The in-process engine of `job` with its ranks' speeds and cost, and those."""
    try:
        # solve plans inline, reads nothing: no prefetch thread, no standby loaders
        data = job.mix().model_copy(update={"prefetch": False, "shadow": False, "stall_timeout_s": None})
        engine = LocalEngine(data, global_batch=job.global_batch, speeds=[1.0] * len(job.ranks),
                             cost=job.plane_cost(),
                             backend=job.balancer.backend)
    except QSyncError:  # names its field already
        raise
    except (ValueError, TypeError, MemoryError) as e:
        raise opening_sources(e) from None
    speeds, cost = rank_model(job, [s.lengths for s in engine.sources])
    engine.plane.speeds = speeds  # the plane reads them at each step
    return engine, speeds, cost


def bound_s(plane: DataPlane, lengths: Sequence[int]) -> float:
    """The balancer's lower bound, in seconds, on the slowest rank of any split of this batch under the plane's
    cost curves, speeds, token cap and count rule."""
    cost, speeds = plane.cost, plane.speeds
    if isinstance(cost, (list, tuple)):
        inst = B.make_instance(None, speeds, lengths, plane.token_cap, plane.equal_counts,
                               rank_costs=list(zip(*(c.costs(lengths) for c in cost))))
    else:
        inst = B.make_instance(cost.costs(lengths), speeds, lengths, plane.token_cap, plane.equal_counts)
    return B.lower_bound(inst) * inst.scale


def step_split(plane: DataPlane, sp: StepPlan) -> StepSplit:
    """One handed-out step as the plan records it: per rank, its samples, tokens and predicted seconds; the
    makespan against the lower bound and the even split's."""
    k = len(plane.speeds)
    ranks = []
    for r in range(k):
        slots = sp.rank_slots(r)
        ranks.append(RankStep(samples=len(slots), tokens=int(sum(sp.lengths[i] for i in slots)),
                              predicted_s=float(sp.predicted[r])))
    makespan = max(sp.predicted)
    bound = bound_s(plane, sp.lengths)
    if plane.policy == SPEC_POLICY["attention"]:  # the balancer balanced these very costs: its bound holds too
        if sp.status == "optimal":
            bound = makespan
        elif np.isfinite(sp.gap):
            bound = max(bound, makespan * (1 - sp.gap))
    even = plane.assign(sp.lengths, policy="stride")
    return StepSplit(step=sp.step, ranks=ranks, makespan_s=makespan, bound_s=bound, even_s=max(even.predicted),
                     even_ranks_s=[float(x) for x in even.predicted],
                     status=sp.status, method=sp.method, time_limited=bool(sp.detail.get("time_limited")))


def next_batch(engine, step: int) -> StepPlan:
    """The engine's next step plan; a batch no split can fit is InfeasibleError naming the step and the loading
    spec's fields (the balancer names a training spec's)."""
    try:
        return engine.next_batch()
    except InfeasibleError as e:
        spelled = {"data.token_cap": "balancer.token_cap"}

        def respell(text: str) -> str:
            for old, new in spelled.items():
                text = text.replace(old, new)
            return text

        raise InfeasibleError(f"step {step}: {respell(e.args[0])}", [respell(d) for d in e.diagnosis]) from None


def summarise(split: Sequence[StepSplit]) -> Summary:
    total = sum(s.makespan_s for s in split)
    bound = sum(s.bound_s for s in split)
    even = sum(s.even_s for s in split)
    n = len(split)
    return Summary(steps=n, step_s=total / n, bound_s=bound / n, even_s=even / n,
                   gap=max(0.0, total - bound) / total if total > 0 else 0.0,
                   speedup=even / total if total > 0 else 1.0,
                   optimal_steps=sum(s.status == "optimal" for s in split),
                   time_limited_steps=sum(s.time_limited for s in split))


def plan_loading(job: LoadingJob, budget: Budget | None = None) -> LoadingPlan:
    """The data plane's split of the job's first `planned_steps` global batches; each step's balancer gets the
    spec's per-step time limit, at most what is left of `budget` (the whole plan's solver seconds)."""
    engine, speeds, cost = open_local(job)
    plane = engine.plane
    limit = job.balancer.time_limit_ms / 1000.0
    split = []
    try:
        for t in range(job.planned_steps):
            granted = budget.grant(f"balance step {t}", limit) if budget is not None else limit
            plane.time_limit_s = granted if granted is not None else MIN_STEP_LIMIT_S
            sp = next_batch(engine, t)
            if budget is not None:
                budget.charge(sp.plan_s)
            split.append(step_split(plane, sp))
    finally:
        engine.close()
    costs = cost if isinstance(cost, list) else [CostModel(cost.a / s, cost.b / s, cost.c0 / s, cost.unit)
                                                 for s in speeds]
    ranks = [RankInfo(name=r.name, device=r.device, speed=s, c0=c.c0, a=c.a, b=c.b)
             for r, s, c in zip(job.ranks, speeds, costs)]
    return LoadingPlan(name=job.name, policy=job.balancer.policy, backend=job.balancer.backend,
                       global_batch=job.global_batch, sources=[s.name for s in job.sources], ranks=ranks,
                       split=split, summary=summarise(split),
                       max_step_s=None if job.max_step_ms is None else job.max_step_ms / 1000.0)
