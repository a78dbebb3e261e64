"""spec -> model -> OpGraph -> indicator + costs -> integer program -> verified Plan.

Each stage is a plain function over plain data (DESIGN.md); this module only wires them
together, runs the replayer's verify-and-refine loop, and writes down what happened.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from qsync_opt.errors import InfeasibleError, ModelError
from qsync_opt.models.from_spec import build_from_spec, input_maker
from qsync_opt.models.graph import OpGraph
from qsync_opt.models.private_rng import private_rng
from qsync_opt.models.tracing import TRACE_BATCH, trace
from qsync_opt.solver.budget import Budget
from qsync_opt.training.infeasible_fixes import precision_fixes
from qsync_opt.training.plan import GroupPlan, Plan, Provenance, SolverReport, graph_fingerprint
from qsync_opt.training.predictor.indicators import compute_indicator, indicator_precisions
from qsync_opt.training.predictor.replayer import replay
from qsync_opt.training.predictor.sensitivity import Sensitivity
from qsync_opt.training.program.instance import evaluate
from qsync_opt.training.solving import (  # noqa: F401 (build_training_instance, resolve_budget, run_backend re-exported)
    baselines_of, build_training_instance, greedy_result, resolve_budget, run_backend)
from qsync_opt.training.spec import JobSpec, load_spec
from qsync_opt.models.export_trace import pinned_notes
from qsync_opt.models.lazy_weights import dense_during_calls
from qsync_opt.precision import PRECISIONS
from qsync_opt.solver.files import save_problem
from qsync_opt.training.batch_split import choose_split
from qsync_opt.training.predictor.indicator_auto import weights_words
from qsync_opt.training.predictor import weight_stream
from qsync_opt.training.program.compile import compile_training
from qsync_opt.training.refine import solve_and_refine

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
    `Prepared.module` holds no weights (training/predictor/weight_stream.py); any other case
    builds it for real, as below."""
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
    # the spec's method (indicators.py), cached; 'auto' reads its cache only (indicate/run compute it)
    with private_rng((spec.training.seed if spec.training else 0) + 1):  # e.g. gvar's dropout masks
        sensitivity, note = compute_indicator(spec, module, graph, compute=False)
    t3 = time.perf_counter()
    return Prepared(module, graph, sensitivity, {"build": t1 - t0, "trace": t2 - t1, "indicator": t3 - t2}, note)


def _prepare_light(spec: JobSpec, t0: float) -> Prepared | None:
    """prepare() without materialising the weights, or None where that cannot be exact."""

    seed = spec.training.seed if spec.training else 0
    built = weight_stream.prepare_light(spec, seed) if weight_stream.light_capable(spec) else None
    if built is None:
        return None
    module, recording, meta_of = built.module, built.recording, built.meta_of
    t1 = time.perf_counter()
    inputs = input_maker(spec)(TRACE_BATCH, torch.Generator().manual_seed(0))
    overlapped = []  # where torch.export captures (seconds of Python), the init replay runs beside it

    def start_replay():
        overlapped.append(weight_stream.start_weight_stats(module, recording, meta_of))

    try:
        with dense_during_calls(module):  # zeros for one module at a time while it runs (fast CPU kernels)
            graph = trace(module, inputs, model_name=spec.model.name or spec.model.import_,
                          leaf_modules=spec.model.leaf_modules, on_export=start_replay)
    except ModelError:
        for f in overlapped:
            f.cancel()
        return None  # a forward that needs real values: traced on real tensors instead
    t2 = time.perf_counter()
    auto = spec.indicator.method == "auto"  # without data, auto is the weight indicator over every format
    precisions = PRECISIONS if auto else indicator_precisions(spec)
    sensitivity = weight_stream.streamed_weight_indicator(module, graph, recording, precisions, meta_of,
                                            overlapped[0] if overlapped else None)
    if sensitivity is None:
        return None
    t3 = time.perf_counter()
    note = (f"indicator: weight on {weights_words(spec)} (auto: no data section, so no data-driven indicator; add "
            "`data:` for the empirical one; weights read one tensor at a time)" if auto else
            "indicator: weight (weight quantisation noise, no data; weights read one tensor at a time)")
    return Prepared(module, graph, sensitivity, {"build": t1 - t0, "trace": t2 - t1, "indicator": t3 - t2}, note)


def plan_job(job: JobSpec, budget: Budget, *, export_problem: "str | Path | None" = None) -> Plan:
    """The plan of a training job, its data-plane section included (what `qsync_opt.solve` gives
    for `kind: training`); every solve it makes draws on the caller's `budget`."""
    plan = plan_training(job, prepare(job), budget, export_problem=export_problem)
    if job.data is None or not job.data.sources:
        return plan
    from qsync_opt.training.data_plane import with_data_plane  # import cost: the data plane (loading/), for data.sources only

    return with_data_plane(job, plan)


def solve(spec_or_path: "str | Path | dict | JobSpec", *, export_problem: "str | Path | None" = None, **overrides: Any) -> Plan:
    """A training spec's plan without its data-plane section, on a budget of its own
    `solver.time_limit_s` (for callers that plan one training spec alone; `qsync_opt.solve`
    plans any kind).

    `overrides` take dotted spec paths, e.g. `solve("job.yaml", **{"solver.backend": "cbc"})`;
    plain keywords `backend`, `time_limit_s`, `rel_gap`, `threads`, `seed` are shorthands for
    the solver section.
    """
    for short in ("backend", "time_limit_s", "rel_gap", "threads", "seed"):
        if short in overrides:
            overrides[f"solver.{short}"] = overrides.pop(short)
    spec = load_spec(spec_or_path, **overrides)
    return plan_training(spec, prepare(spec), export_problem=export_problem)


def plan_training(spec: JobSpec, prepared: Prepared, budget: Budget | None = None, *,
                  export_problem: "str | Path | None" = None) -> Plan:
    """Everything below draws on `budget`: split search, solve, tie-break, refine rounds and
    diagnosis; model building is timed apart and reported beside it. Without a budget (a caller
    planning one spec alone) this call makes its one Budget of `solver.time_limit_s`."""

    t0 = time.perf_counter()
    if budget is None:
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
        save_problem(compile_training(instance), str(export_problem))
        notes.append(f"problem exported to {export_problem}")
    if prepared.indicator_note:
        notes.append(prepared.indicator_note)

    notes.extend(pinned_notes(prepared.graph))  # GEMMs and attention kept at fp32, and why
    warm = greedy_result(instance) if spec.solver.refine_rounds > 0 else None
    try:
        result, rounds, meets = solve_and_refine(spec, instance, ctx, lambda inst: run_backend(spec, inst, budget),
                                                 budget, warm)
    except InfeasibleError as e:  # formats the spec left out that would give a plan (infeasible_fixes.py)
        e.diagnosis.extend(precision_fixes(spec, prepared, budget, local_batches))
        raise
    notes.extend(result["notes"])
    if rounds and result["backend"] != "greedy":
        notes.append(f"status {result['status']!r} and the gap are measured against the bound of the original, untightened "
                     f"linear model (it holds for every plan the {rounds} refine round(s) produced), not of a tightened one")
    baselines = {**baselines_of(instance, ctx), **extra}
    timing = {"build_s": budget.build_s, "solve_s": budget.spent_s}
    return _make_plan(spec, prepared, instance, ctx, result, rounds, baselines, notes, time.perf_counter() - t0,
                      meets, timing)


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
            kernels={op: k for op in ig.allowed if (k := gc.kernels.get(op, {}).get(a[gc.name][op]))},
            compute_ms=t.compute_ms,
            comm_exposed_ms=t.comm_exposed_ms,
            iteration_ms=t.iteration_ms,
            time_bound_ms=ig.time_bound_ms,
            peak_memory_bytes=t.peak_memory_bytes,
            memory_capacity_bytes=gc.mem_capacity_bytes,
            indicator=sum(instance.omega[op][p] for op, p in a[gc.name].items()),
            cost_source=gc.cost_kind,
        )
    timings = ", ".join(f"{k} {v:.2f}s" for k, v in prepared.timings_s.items())
    bounds = [ig.time_bound_ms for ig in instance.groups if ig.time_bound_ms is not None]
    if bounds and tl.iteration_ms > max(bounds) * (1 + 1e-6):
        notes = [*notes, f"lockstep iteration {tl.iteration_ms:.1f} ms is {tl.iteration_ms / max(bounds) - 1:.1%} above "
                         f"the bound {max(bounds):.1f} ms"]
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
        backward_precision=spec.runtime.backward_precision,
        fingerprint=graph_fingerprint(prepared.graph),
        indicator_used=prepared.indicator_note or f"indicator: {spec.indicator.method}",
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
