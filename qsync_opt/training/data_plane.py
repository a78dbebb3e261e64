"""A training plan's data-plane section, for a spec with `data.sources`.

What `qsync-opt solve` adds to the plan, and what the trainer's coordinator uses:
- each rank's cost curve and speed from its group's plan (`loading.speeds`): the group's
  predicted compute_ms at its precisions and local batch, over the FLOPs of that batch of
  traced-length samples, gives its seconds per FLOP; c_g(L) = seconds per FLOP x FLOPs(L);
- the loader workers per source under the CPU budget `data.loader_cpus` (`loading.sizing`),
  from each source's preprocessing time measured here, its peak share over the weight
  schedule and the samples per second the plan's iteration consumes.
"""

from __future__ import annotations

import os

from qsync_opt.training.plan import DataPlaneGroup, DataPlanePlan, Plan
from qsync_opt.training.spec import JobSpec
from qsync_opt.data.task import sequence_length
from qsync_opt.loading.cost import CostModel, from_module
from qsync_opt.loading.plane import SPEC_POLICY
from qsync_opt.loading.sizing import measure_cost, peak_shares, size_loaders
from qsync_opt.loading.sources import open_source
from qsync_opt.loading.speeds import group_speeds as speeds_of, per_rank
from qsync_opt.models.from_spec import build_from_spec

SPEEDS_FROM = ("each group's predicted compute_ms (its precisions, local batch, {cost_source} costs) over the "
               "FLOPs of that batch at the traced length {L0}: seconds per FLOP; c_g(L) = seconds per FLOP x "
               "FLOPs(L), FLOPs(L) = {a:.4g}·L + {b:.4g}·L² (6 x linear weights; 12 x layers x hidden for attention)")


def model_shape(model) -> tuple[int, int]:
    """(layers, hidden) of a transformer: its config where it has one, else the longest
    ModuleList of blocks and the first embedding's width."""
    from torch import nn

    cfg = getattr(model, "config", None)
    layers = next((getattr(cfg, k) for k in ("num_hidden_layers", "n_layer") if cfg is not None and hasattr(cfg, k)), None)
    hidden = next((getattr(cfg, k) for k in ("hidden_size", "n_embd") if cfg is not None and hasattr(cfg, k)), None)
    if layers is None:
        layers = max((len(m) for m in model.modules() if isinstance(m, nn.ModuleList)), default=0)
    if hidden is None:
        hidden = next((m.embedding_dim for m in model.modules() if isinstance(m, nn.Embedding)), 0)
    return int(layers), int(hidden)


def flop_curve(spec: JobSpec):
    model = build_from_spec(spec)
    layers, hidden = model_shape(model)
    return from_module(model, layers=layers, hidden=hidden)


def reference_length(spec: JobSpec) -> int:
    return sequence_length(spec)


def group_speeds(spec: JobSpec, plan: Plan, flops=None):
    """loading.speeds.GroupSpeed per group of the plan, in the cluster's order."""

    flops = flops or flop_curve(spec)
    rows = [(g.name, g.count, plan.group(g.name).local_batch, plan.group(g.name).compute_ms)
            for g in spec.cluster.groups]
    return speeds_of(flops, rows, reference_length(spec))


def rank_costs(spec: JobSpec, plan: Plan | None):
    """(speeds, per-rank c(L) curves, where they came from) in rank order. With the plan's
    data-plane section its figures are used as written; without a plan, every rank gets the
    FLOP curve (equal speeds), and the note says so."""

    if plan is not None and plan.data_plane is not None:
        dp = plan.data_plane
        speeds, costs = [], []
        for g in spec.cluster.groups:
            row = dp.groups[g.name]
            speeds += [row.speed] * g.count
            costs += [CostModel(a=row.a, b=row.b, c0=row.c0, unit="s")] * g.count
        return speeds, costs, dp.speeds_from
    flops = flop_curve(spec)
    if plan is None:
        n = sum(g.count for g in spec.cluster.groups)
        return [1.0] * n, [flops] * n, "no plan: every rank at equal speed on the FLOP curve"
    speeds, costs = per_rank(group_speeds(spec, plan, flops))
    return speeds, costs, "the plan's groups (no data-plane section in the plan)"


def plan_data_plane(spec: JobSpec, plan: Plan, *, measure_samples: int = 32) -> DataPlanePlan:
    data = spec.data
    flops = flop_curve(spec)
    L0 = reference_length(spec)
    speeds = group_speeds(spec, plan, flops)
    cost_source = "/".join(sorted({g.cost_source for g in plan.groups.values()}))
    groups = {g.name: DataPlaneGroup(speed=g.speed, seconds_per_flop=g.seconds_per_flop, c0=g.cost.c0, a=g.cost.a,
                                     b=g.cost.b) for g in speeds}
    sources = [open_source(s, i) for i, s in enumerate(data.sources)]
    names = [s.name for s in data.sources]
    prep = [measure_cost(src, measure_samples) for src in sources]
    shares = peak_shares([s.schedule or [(0, s.weight_at(0))] for s in data.sources])
    global_batch = sum(g.local_batch * g.count for g in plan.groups.values())
    rate = global_batch / (plan.iteration_ms / 1e3)
    cpus = data.loader_cpus or os.cpu_count() or 1
    sizing = size_loaders(names, prep, shares, rate, cpus, time_limit_s=2.0)
    notes = [sizing.report(), "preprocessing time per sample measured here (median CPU time over "
             f"{measure_samples} samples); demand = peak share x {rate:.1f} samples/s "
             f"(global batch {global_batch} / predicted iteration {plan.iteration_ms:.1f} ms)",
             "modelled: the L/L² split of each rank's cost is the FLOP count's; the optimizer's share of compute_ms "
             "is spread over the samples"]
    return DataPlanePlan(
        policy=SPEC_POLICY[data.balance_policy], balance=data.balance_policy, reference_length=L0,
        flops_a=flops.a, flops_b=flops.b,
        speeds_from=SPEEDS_FROM.format(cost_source=cost_source, L0=L0, a=flops.a, b=flops.b),
        groups=groups, loader_cpus=cpus, loader_workers=sizing.workers,
        preprocess_ms={n: p * 1e3 for n, p in zip(names, prep)}, demand_samples_per_s=sizing.demand,
        supply_ratio=sizing.supply_ratio, sizing_status=sizing.status, notes=notes)


def with_data_plane(spec, plan):
    """The plan with its data-plane section when the spec has data.sources; otherwise as it is."""
    data = getattr(spec, "data", None)
    if not isinstance(plan, Plan) or data is None or not data.sources:
        return plan
    return plan.model_copy(update={"data_plane": plan_data_plane(spec, plan)})
