"""spec -> model -> OpGraph -> indicator + costs -> integer program -> verified Plan.

Each stage is a plain function over plain data (DESIGN.md); this module only wires them
together, runs the replayer's verify-and-refine loop, and writes down what happened.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from qsync_opt.errors import InfeasibleError, SpecError
from qsync_opt.models.from_spec import build_from_spec, input_maker
from qsync_opt.models.graph import OpGraph
from qsync_opt.models.private_rng import private_rng
from qsync_opt.models.trace import trace
from qsync_opt.plan import Baseline, GroupPlan, Plan, Provenance, SolverReport, graph_fingerprint
from qsync_opt.predictor.context import Context
from qsync_opt.predictor.indicators import compute_indicator
from qsync_opt.predictor.instance_builder import baseline, build_instance
from qsync_opt.predictor.replayer import replay
from qsync_opt.predictor.sensitivity import Sensitivity
from qsync_opt.solver.instance import Assignment, TrainingInstance, evaluate
from qsync_opt.spec import JobSpec, load_spec

TRACE_BATCH = 1
"""Graphs are traced at batch 1 and rescaled per group (OpGraph.for_batch): cheap and exact for FLOPs."""


@dataclass(frozen=True)
class Prepared:
    """What a spec's model contributes before any device is considered."""

    module: nn.Module
    graph: OpGraph
    sensitivity: Sensitivity
    timings_s: dict[str, float]
    indicator_note: str = ""
    """Which indicator method made ω, from what (plan notes name it)."""


def prepare(spec: JobSpec) -> Prepared:
    """Build the model, trace it and compute its indicator (the device-independent stages).

    The weight indicator of random weights needs shapes and one weight at a time: the model is
    then built on the meta device and traced with zero-stride placeholder weights, so
    `Prepared.module` holds no weights (predictor/weight_stream.py); any other case builds it
    for real, as below."""
    t0 = time.perf_counter()
    light = _prepare_light(spec, t0)
    if light is not None:
        return light
    with private_rng(spec.training.seed if spec.training else 0):  # never torch's global RNG (private_rng.py)
        module = build_from_spec(spec)
    t1 = time.perf_counter()
    inputs = input_maker(spec)(TRACE_BATCH, torch.Generator().manual_seed(0))
    name = spec.model.name or spec.model.import_
    graph = trace(module, inputs, model_name=name, leaf_modules=spec.model.leaf_modules)
    t2 = time.perf_counter()
    with private_rng((spec.training.seed if spec.training else 0) + 1):  # e.g. gvar's dropout masks
        sensitivity, note = compute_indicator(spec, module, graph)  # the spec's method (indicators.py), cached
    t3 = time.perf_counter()
    return Prepared(module, graph, sensitivity, {"build": t1 - t0, "trace": t2 - t1, "indicator": t3 - t2}, note)


def _prepare_light(spec: JobSpec, t0: float) -> Prepared | None:
    """prepare() without materialising the weights, or None where that cannot be exact."""
    from qsync_opt.errors import ModelError
    from qsync_opt.predictor.indicators import indicator_precisions
    from qsync_opt.predictor.weight_stream import light_capable, prepare_light, streamed_weight_indicator

    built = prepare_light(spec, spec.training.seed if spec.training else 0) if light_capable(spec) else None
    if built is None:
        return None
    module, recording, meta_of = built
    t1 = time.perf_counter()
    inputs = input_maker(spec)(TRACE_BATCH, torch.Generator().manual_seed(0))
    from qsync_opt.models.lazy_weights import dense_during_calls

    try:
        with dense_during_calls(module):  # zeros for one module at a time while it runs (fast CPU kernels)
            graph = trace(module, inputs, model_name=spec.model.name or spec.model.import_,
                          leaf_modules=spec.model.leaf_modules)
    except ModelError:
        return None  # a forward that needs real values: traced on real tensors instead
    t2 = time.perf_counter()
    sensitivity = streamed_weight_indicator(module, graph, recording, indicator_precisions(spec), meta_of)
    if sensitivity is None:
        return None
    t3 = time.perf_counter()
    return Prepared(module, graph, sensitivity, {"build": t1 - t0, "trace": t2 - t1, "indicator": t3 - t2},
                    "indicator: weight (weight quantisation noise, no data; weights read one tensor at a time)")


def solve(spec_or_path: "str | Path | dict | JobSpec", *, export_problem: "str | Path | None" = None, **overrides: Any) -> Plan:
    """Plan a job: the public entry point for users (a path) and schedulers (a JobSpec or dict).

    `overrides` take dotted spec paths, e.g. `solve("job.yaml", **{"solver.backend": "cbc"})`;
    plain keywords `backend`, `time_limit_s`, `rel_gap` are shorthands for the solver section.
    """
    for short in ("backend", "time_limit_s", "rel_gap", "threads", "seed"):
        if short in overrides:
            overrides[f"solver.{short}"] = overrides.pop(short)
    spec = load_spec(spec_or_path, **overrides)
    if spec.kind == "serving":
        from qsync_opt.serving_planner import plan_serving

        if export_problem is not None:
            raise SpecError("--export-problem is for training specs; a serving plan solves one program per order and micro-batch pair")
        return plan_serving(spec)
    prepared = prepare(spec)
    return plan_training(spec, prepared, export_problem=export_problem)


def plan_training(spec: JobSpec, prepared: Prepared, *, export_problem: "str | Path | None" = None) -> Plan:
    """One budget of `solver.time_limit_s` for everything below: split search, solve, tie-break,
    refine rounds and diagnosis; model building is timed apart and reported beside it."""
    from qsync_opt.batch_split import choose_split
    from qsync_opt.refine import solve_and_refine
    from qsync_opt.solver.budget import Budget

    t0 = time.perf_counter()
    budget = Budget(spec.solver.time_limit_s)
    notes: list[str] = []
    if spec.training.batch_split == "auto":
        split = choose_split(spec, prepared, budget)
        spec, local_batches, extra = split.spec, split.local_batches, split.baselines
        notes.extend(split.notes)
    else:
        local_batches, extra = None, {}
    instance, ctx = build_training_instance(spec, prepared, local_batches)
    if export_problem:
        from qsync_opt.solver.export import save_problem
        from qsync_opt.solver.training import compile_training

        save_problem(compile_training(instance), str(export_problem))
        notes.append(f"problem exported to {export_problem}")
    if prepared.indicator_note:
        notes.append(prepared.indicator_note)
    greedy_result = _greedy_result(instance) if spec.solver.refine_rounds > 0 else None
    result, rounds, meets = solve_and_refine(spec, instance, ctx, lambda inst: run_backend(spec, inst, budget),
                                             budget, greedy_result)
    notes.extend(result["notes"])
    if rounds and result["backend"] != "greedy":
        notes.append(f"status {result['status']!r} and the gap are those of the model tightened by {rounds} "
                     "refine round(s), not of the original linear model")
    baselines = {**_baselines(instance, ctx), **extra}
    timing = {"build_s": budget.build_s, "solve_s": budget.spent_s}
    return _make_plan(spec, prepared, instance, ctx, result, rounds, baselines, notes, time.perf_counter() - t0,
                      meets, timing)


def build_training_instance(spec: JobSpec, prepared: Prepared, local_batches=None) -> tuple[TrainingInstance, Context]:
    """The predictor's instance, with a percentage indicator budget ("5%") made absolute."""
    instance, ctx = build_instance(
        spec, prepared.graph, prepared.sensitivity, local_batches=local_batches, boundary=spec.runtime.boundary
    )
    return resolve_budget(spec, instance), ctx


def resolve_budget(spec: JobSpec, instance: TrainingInstance) -> TrainingInstance:
    """`max_accuracy_degradation: "5%"` -> 5% of the uniform-lowest plan's share-weighted indicator."""
    raw = spec.objective.max_accuracy_degradation
    if not isinstance(raw, str):
        return instance
    free = replace(instance, max_degradation=None)
    lowest = evaluate(free, baseline(free, "lowest")).degradation
    return replace(instance, max_degradation=float(raw.rstrip("%")) / 100.0 * lowest)


def _greedy_result(instance: TrainingInstance) -> dict | None:
    from qsync_opt.solver.greedy import greedy

    g = greedy(instance)
    if not g.feasible:
        return None
    return dict(assignment=g.assignment, backend="greedy", status="heuristic",
                objective=evaluate(instance, g.assignment).objective(instance), bound=None, gap=None, wall_s=0.0, notes=[])


def run_backend(spec: JobSpec, instance: TrainingInstance, budget=None) -> dict:
    """One solve with the spec's backend on `budget` (the spec's time limit if None)."""
    from qsync_opt.solver.budget import Budget
    from qsync_opt.solver.solve import DEFAULT_BACKEND, diagnose, solve_instance
    from qsync_opt.solver.uniform import uniform_policy

    budget = budget or Budget(spec.solver.time_limit_s)
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
    r = solve_instance(instance, backend=backend, time_limit_s=budget.remaining(), rel_gap=s.rel_gap,
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


def _baselines(instance: TrainingInstance, ctx: Context) -> dict[str, Baseline]:
    out = {}
    for label, kind in (("all highest (fp32)", "highest"), ("uniform lowest", "lowest")):
        a = baseline(instance, kind)
        out[label] = _as_baseline(instance, ctx, a)
    from qsync_opt.solver.greedy import greedy

    g = greedy(instance)
    if g.feasible:
        out["greedy (gain per ms)"] = _as_baseline(instance, ctx, g.assignment)
    from qsync_opt.solver.qsync_greedy import qsync_greedy

    q = qsync_greedy(instance, lambda a: replay(ctx, a).iteration_ms)  # QSync's rule, judged by the replayer
    out["qsync greedy (QSync allocator)"] = _as_baseline(instance, ctx, q)
    return out


def _as_baseline(instance: TrainingInstance, ctx: Context, a: Assignment) -> Baseline:
    tl = replay(ctx, a)
    ev = evaluate(instance, a)
    in_time = all(  # judged like the plan: by the replayer's timeline, not the linear model
        g.time_bound_ms is None or tl.groups[g.name].iteration_ms <= g.time_bound_ms * (1 + 1e-6)
        for g in instance.groups
    )
    return Baseline(
        iteration_ms=tl.iteration_ms,
        indicator=ev.degradation,
        peak_memory_bytes={n: t.peak_memory_bytes for n, t in tl.groups.items()},
        feasible=ev.feasible and in_time,
        precisions={g.name: {op: a[g.name][op] for op in g.allowed} for g in instance.groups},
        group_indicator={g.name: sum(instance.omega[op][a[g.name][op]] for op in g.allowed) for g in instance.groups},
        local_batches={gc.name: gc.local_batch for gc in ctx.groups},
    )


def _make_plan(spec, prepared, instance, ctx, result, rounds, baselines, notes, wall_s, meets=True, timing=None) -> Plan:
    a = result["assignment"]
    tl = replay(ctx, a)
    ev = evaluate(instance, a)
    groups = {}
    for gc in ctx.groups:
        t = tl.groups[gc.name]
        ig = instance.group(gc.name)
        groups[gc.name] = GroupPlan(
            device=gc.device.name,
            count=gc.count,
            local_batch=gc.local_batch,
            precisions={op: a[gc.name][op] for op in ig.allowed},
            compute_ms=t.compute_ms,
            comm_exposed_ms=t.comm_exposed_ms,
            iteration_ms=t.iteration_ms,
            time_bound_ms=ig.time_bound_ms,
            peak_memory_bytes=t.peak_memory_bytes,
            memory_capacity_bytes=gc.mem_capacity_bytes,
            indicator=sum(instance.omega[op][p] for op, p in a[gc.name].items()),
            cost_source="measured" if gc.cost_source.startswith("measured") else "roofline",
        )
    timings = ", ".join(f"{k} {v:.2f}s" for k, v in prepared.timings_s.items())
    bounds = [ig.time_bound_ms for ig in instance.groups if ig.time_bound_ms is not None]
    if bounds and tl.iteration_ms > max(bounds) * (1 + 1e-6):
        notes = [*notes, f"lockstep iteration {tl.iteration_ms:.1f} ms is {tl.iteration_ms / max(bounds) - 1:.1%} above "
                         f"the bound {max(bounds):.1f} ms that each group meets on its own: every bucket's all-reduce "
                         "waits for the later group's gradients, which no single group's time includes"]
    report = SolverReport(
        backend=result["backend"], status=result["status"], objective=result["objective"],
        best_bound=result["bound"], gap=result["gap"], wall_s=wall_s, refine_rounds=rounds,
        build_s=(timing or {}).get("build_s", 0.0), solve_s=(timing or {}).get("solve_s", 0.0),
        notes=list(dict.fromkeys([*ctx.notes, *notes, f"{timings}, plan {wall_s:.2f}s"])),  # once each, in order
    )
    return Plan(
        job=spec.name,
        model=prepared.graph.model,
        objective=spec.objective.minimize,
        groups=groups,
        iteration_ms=tl.iteration_ms,
        indicator=ev.degradation,
        solver=report,
        meets_bounds=meets,
        baselines=baselines,
        provenance=Provenance(spec_digest=spec.digest(), versions=_versions()),
        boundary=spec.runtime.boundary,
        fingerprint=graph_fingerprint(prepared.graph),
    )


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for pkg in ("qsync-opt", "torch", "pulp", "highspy", "ortools", "pydantic"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            pass
    return out
