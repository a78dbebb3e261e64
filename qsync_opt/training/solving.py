"""The solve step that the pipeline and the batch-split search share: one backend call on the
spec's settings, the percentage indicator budget made absolute, and the baselines judged as
the plan is (by the replayer's timeline)."""

from __future__ import annotations

import time
from dataclasses import replace

from qsync_opt.errors import InfeasibleError
from qsync_opt.solver.budget import Budget
from qsync_opt.training.plan import Baseline
from qsync_opt.training.predictor.context import Context
from qsync_opt.training.predictor.instance_builder import baseline, build_instance
from qsync_opt.training.predictor.replayer import replay
from qsync_opt.training.program.instance import Assignment, TrainingInstance, evaluate
from qsync_opt.training.spec import JobSpec
from qsync_opt.training.program.greedy import greedy
from qsync_opt.training.program.qsync_greedy import qsync_greedy
from qsync_opt.training.program.solve import DEFAULT_BACKEND, diagnose, solve_instance
from qsync_opt.training.program.uniform import uniform_policy
from qsync_opt.training import refine


def resolve_budget(spec: JobSpec, instance: TrainingInstance) -> TrainingInstance:
    """`max_accuracy_degradation: "5%"` -> 5% of the uniform-lowest plan's share-weighted indicator."""
    raw = spec.objective.max_accuracy_degradation
    if not isinstance(raw, str):
        return instance
    free = replace(instance, max_degradation=None)
    lowest = evaluate(free, baseline(free, "lowest")).degradation
    return replace(instance, max_degradation=float(raw.rstrip("%")) / 100.0 * lowest)


def greedy_result(instance: TrainingInstance) -> dict | None:
    g = greedy(instance)
    if not g.feasible:
        return None
    return dict(assignment=g.assignment, backend="greedy", status="heuristic",
                objective=evaluate(instance, g.assignment).objective(instance), bound=None, gap=None, wall_s=0.0, notes=[])


def run_backend(spec: JobSpec, instance: TrainingInstance, budget: Budget) -> dict:
    """One solve with the spec's backend, drawing on the caller's `budget`."""

    backend = DEFAULT_BACKEND if spec.solver.backend == "default" else spec.solver.backend
    t0 = time.perf_counter()
    if backend == "uniform":
        try:
            assignment = uniform_policy(instance)
        except InfeasibleError as e:
            raise InfeasibleError(str(e).splitlines()[0], diagnose(instance, budget=budget) or e.diagnosis) from None
        ev = evaluate(instance, assignment)
        budget.charge(time.perf_counter() - t0)
        return dict(assignment=assignment, backend="uniform", status="heuristic", objective=ev.objective(instance),
                    bound=None, gap=None, wall_s=time.perf_counter() - t0, notes=[])
    s = spec.solver
    r = solve_instance(instance, backend=backend, rel_gap=s.rel_gap,
                       threads=s.threads, seed=s.seed, budget=budget)
    notes = []
    if r.scaling:
        notes.append(f"cpsat integer scaling: {r.scaling}")
    if r.warm_start_used:
        notes.append("warm-started from the greedy plan")
    if r.message:
        notes.append(f"{r.backend}: {r.message}")
    status = "heuristic" if r.backend == "greedy" else r.status
    return dict(assignment=r.assignment, backend=r.backend, status=status, objective=r.objective,
                bound=r.bound, gap=r.gap, wall_s=r.wall_s, notes=notes)


def baselines_of(instance: TrainingInstance, ctx: Context) -> dict[str, Baseline]:
    out = {}
    for label, kind in (("all highest (fp32)", "highest"), ("uniform lowest", "lowest")):
        a = baseline(instance, kind)
        out[label] = as_baseline(instance, ctx, a)

    g = greedy(instance)
    if g.feasible:
        out["greedy (gain per ms)"] = as_baseline(instance, ctx, g.assignment)

    q = qsync_greedy(instance, lambda a: replay(ctx, a).iteration_ms)  # QSync's rule, judged by the replayer
    out["qsync greedy (QSync allocator)"] = as_baseline(instance, ctx, q)
    return out


def as_baseline(instance: TrainingInstance, ctx: Context, a: Assignment) -> Baseline:
    tl = replay(ctx, a)
    ev = evaluate(instance, a)
    in_time = refine.meets_time_bound(instance, tl.iteration_ms)  # judged like the plan: the replayer's lockstep iteration
    return Baseline(
        iteration_ms=tl.iteration_ms,
        indicator=ev.degradation,
        peak_memory_bytes={n: t.peak_memory_bytes for n, t in tl.groups.items()},
        feasible=ev.feasible and in_time,
        precisions={g.name: {op: a[g.name][op] for op in g.allowed} for g in instance.groups},
        group_indicator={g.name: sum(instance.omega[op][a[g.name][op]] for op in g.allowed) for g in instance.groups},
        local_batches={gc.name: gc.local_batch for gc in ctx.groups},
    )


def build_training_instance(spec: JobSpec, prepared, local_batches=None) -> tuple[TrainingInstance, Context]:
    """The predictor's instance, with a percentage indicator budget ("5%") made absolute."""
    instance, ctx = build_instance(
        spec, prepared.graph, prepared.sensitivity, local_batches=local_batches, boundary=spec.runtime.boundary
    )
    return resolve_budget(spec, instance), ctx
