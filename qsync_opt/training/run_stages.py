"""The measuring stages of `qsync-opt run`: profile, indicate, predict.

Each takes the run's spec and output folder and returns the path of a small JSON artefact in
that folder, which says what the stage did (and why it skipped a group), so that a cached
stage can be reported later without redoing it. The heavy data lives in the caches the
stand-alone verbs use (this machine's profile, the indicator cache), so `run` and
`qsync-opt profile | indicate | predict` share one copy.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

from qsync_opt.io import atomic_write_text
from qsync_opt.training.spec import JobSpec, load_spec
from qsync_opt.errors import ModelError, SpecError
from qsync_opt.models.from_spec import build_from_spec, input_maker
from qsync_opt.models.private_rng import private_rng
from qsync_opt.models.tracing import TRACE_BATCH, symbolic_trace, trace
from qsync_opt.training.pipeline import prepare
from qsync_opt.training.plan import Plan
from qsync_opt.training.predictor.indicator_auto import resolved_method
from qsync_opt.training.predictor.indicators import compute_indicator
from qsync_opt.training.predictor.instance_builder import build_instance
from qsync_opt.training.predictor.profile import (default_profile_path, load_profile, op_signature,
                                                  runtime_tag, step_key)
from qsync_opt.training.predictor import profiler
from qsync_opt.training.predictor.measuring import gpu_not_profiled, group_threads, is_local, local_ranks
from qsync_opt.training.predictor.replayer import replay
from qsync_opt.training.predictor.timeline_export import write_chrome_trace, write_png


def _graph(spec: JobSpec):
    """The model's graph at the trace batch (as pipeline.prepare traces it)."""
    import torch



    with private_rng(spec.training.seed):  # as pipeline.prepare: never torch's global RNG
        module = build_from_spec(spec)
    inputs = input_maker(spec)(TRACE_BATCH, torch.Generator().manual_seed(0))
    return trace(module, inputs, model_name=spec.model.name or spec.model.import_, leaf_modules=spec.model.leaf_modules)


def missing_profile(spec: JobSpec, graph) -> tuple[dict[str, str], dict[str, str]]:
    """(groups to profile here -> why, groups left alone -> why).

    A group is profiled only when its costs may be measured (`costs:` is not roofline), it has
    no `profile:` file of its own, its device runs here, and this machine's profile lacks any
    entry the profiler would write for it (the same list `profile_group` works through).
    """

    path = default_profile_path()
    prof = load_profile(path) if path.exists() else None  # another machine's profile: refused by name
    todo, skip = {}, {}
    for g in spec.cluster.groups:
        if spec.costs == "roofline":
            skip[g.name] = "costs: roofline"
            continue
        if g.profile:
            skip[g.name] = f"has its own profile: {g.profile}"
            continue
        if not is_local(g.device_spec):
            skip[g.name] = f"device {g.device_spec.name} does not run here"
            continue
        if (why := gpu_not_profiled(spec, g)) is not None:
            skip[g.name] = why
            continue
        sec = prof.find_section(g.env, group_threads(g, spec.cluster.world_size), local_ranks(spec),
                                runtime_tag(spec.runtime)) if prof else None
        if sec is None:
            tag = f" under runtime {runtime_tag(spec.runtime)}" if runtime_tag(spec.runtime) else ""
            todo[g.name] = f"no section for env {g.env or '{}'}{tag} in {path}" if prof else f"no profile at {path}"
            continue
        gg = graph.for_batch(spec.local_batches()[g.name])
        lacking = [op_signature(n, p) for n in gg.nodes for p in (g.allowed_precisions if n.selectable else ("fp32",))
                   if op_signature(n, p) not in sec.ops]
        if lacking or not sec.casts or step_key(spec.training.optimizer, gg) not in sec.optimizer:
            todo[g.name] = f"{path} lacks {len(lacking)} op entries" + ("" if sec.casts else " and the casts")
        else:
            skip[g.name] = f"measured in {path}"
    return todo, skip


def _not_profilable(spec: JobSpec) -> str | None:
    """Why the per-op profiler cannot time this model (it replays an fx graph op by op), or None."""
    import torch

    with torch.device("meta"):
        module = build_from_spec(spec)
    try:
        symbolic_trace(module, spec.model.leaf_modules)
    except ModelError:
        return ("the per-op profiler replays a symbolic-fx graph and this model is captured with torch.export "
                "(fx cannot follow it); its costs stay roofline")
    return None


def profile_stage(spec: JobSpec, out: Path, log: Callable[[str], None]) -> str:
    """Measure the local groups that have no usable profile yet (the profiler resumes partial ones)."""

    todo, skip = ({}, {g.name: "costs: roofline" for g in spec.cluster.groups}) if spec.costs == "roofline" \
        else missing_profile(spec, _graph(spec))
    for name, why in skip.items():
        log(f"  {name}: not profiled ({why})")
    t0, before = time.perf_counter(), os.getloadavg()
    if todo and (why_not := _not_profilable(spec)) is not None:
        skip.update({name: why_not for name in todo})
        log(f"  {', '.join(todo)}: not profiled ({why_not})")
        todo = {}
    if todo:
        for name, why in todo.items():
            log(f"  {name}: profiling ({why})")
        profiler.profile_spec(spec, default_profile_path(), groups=list(todo), progress=False, log=lambda s: log(f"  {s}"))
    record = {"profile": str(default_profile_path()), "profiled": todo, "skipped": skip,
              "wall_s": round(time.perf_counter() - t0, 2), "load_before": before, "load_after": os.getloadavg()}
    return str(atomic_write_text(out / "profile.json", json.dumps(record, indent=1)))


def indicate_stage(spec: JobSpec, out: Path, log: Callable[[str], None]) -> str:
    """The spec's indicator (from the shared indicator cache when it is there), ω kept in DIR."""

    sens, note = compute_indicator(spec, log=lambda s: log(f"  {s}"), progress=True)
    log(f"  {note}")
    record = {"method": spec.indicator.method, "resolved": resolved_method(spec), "note": note, "omega": sens.omega}
    return str(atomic_write_text(out / "indicator.json", json.dumps(record, indent=1)))


def predict_stage(spec_path: str, out: Path, log: Callable[[str], None]) -> str:
    """Replay the plan: lockstep iteration, per-group breakdown, Chrome trace and PNG timeline."""

    spec, ctx, tl = predict_plan(spec_path, out / "plan.json")
    write_chrome_trace(tl, out / "timeline.trace.json")
    write_png(tl, out / "timeline.png", f"{spec.name}: {tl.iteration_ms:.2f} ms per iteration (predicted)")
    groups = {gc.name: {"forward_ms": tl.groups[gc.name].forward_ms, "backward_ms": tl.groups[gc.name].backward_ms,
                        "cast_ms": tl.groups[gc.name].cast_ms + tl.groups[gc.name].weight_cast_ms,
                        "optimizer_ms": tl.groups[gc.name].optimizer_ms,
                        "comm_exposed_ms": tl.groups[gc.name].comm_exposed_ms, "idle_ms": tl.idle_ms[gc.name],
                        "costs": gc.cost_source} for gc in ctx.groups}
    log(f"  predicted lockstep iteration {tl.iteration_ms:.2f} ms")
    record = {"iteration_ms": tl.iteration_ms, "groups": groups, "trace": "timeline.trace.json", "png": "timeline.png"}
    return str(atomic_write_text(out / "predict.json", json.dumps(record, indent=1)))


def lockstep_step_ms(metrics: Path) -> dict[int, float]:
    """step -> its slowest rank's step_ms, from train's per-rank JSON lines (what a lockstep waits for)."""
    per_step: dict[int, float] = {}
    for f in sorted(metrics.glob("rank*.jsonl")):
        for line in f.read_text().splitlines():
            r = json.loads(line)
            if "step_ms" in r:
                per_step[r["step"]] = max(per_step.get(r["step"], 0.0), r["step_ms"])
    return per_step


def measured_iteration_ms(metrics: Path) -> tuple[float, int] | None:
    """(median lockstep step time in ms, steps counted) from train's per-rank JSON lines.

    A step's time is its slowest rank's; the first step (allocations, oneDNN primitive
    creation) is left out when there are later ones.
    """
    per_step = lockstep_step_ms(metrics)
    steps = sorted(per_step)[1:] if len(per_step) > 1 else sorted(per_step)
    if not steps:
        return None
    times = sorted(per_step[s] for s in steps)
    mid = len(times) // 2
    median = times[mid] if len(times) % 2 else (times[mid - 1] + times[mid]) / 2
    return median, len(times)


def predict_plan(spec_path, plan_path):
    """(spec, Context, Timeline) of a saved plan replayed under the spec's cost model."""

    spec = load_spec(spec_path)
    plan = Plan.load(plan_path)
    missing = [g.name for g in spec.cluster.groups if g.name not in plan.groups]
    if missing:
        raise SpecError(f"--plan {plan_path}: no plan for group(s) {missing}; solve this spec again")
    prepared = prepare(spec)
    _, ctx = build_instance(spec, prepared.graph, prepared.sensitivity,
                            local_batches={n: g.local_batch for n, g in plan.groups.items()},
                            boundary=spec.runtime.boundary)
    return spec, ctx, replay(ctx, {n: dict(g.precisions) for n, g in plan.groups.items()})
