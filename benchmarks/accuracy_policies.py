"""The seven policies of the accuracy harness, planned for a hybrid cluster by the library itself.

For one (task, cluster, setting) every policy is a precision map per group plus local batches
at the cluster's scale, with its replayed iteration time and its share-weighted indicator
(the scale of Plan.indicator):
  fp32            the plan's baseline 'all highest (fp32)' (the accuracy ceiling)
  uniform-lowest  baseline 'uniform lowest': the weak group at its lowest format everywhere
  qsync-greedy    baseline 'qsync greedy (QSync allocator)': QSync's own rule
  greedy          baseline 'greedy (gain per ms)': our stronger greedy
  ilp             the plan (HiGHS), fixed local batches
  batching        every group at its highest offered precision (fp32; int8 on an int-only weak
                  device), the split of the global batch with the lowest replayed iteration
                  time (QSync's dynamic-batching baseline: slower devices get smaller batches)
  joint           batch_split: auto, precision and split together, bounded by the ilp's bound

Where the weak group does not offer fp32 (setting `intonly`: an inference device running
int8 and int4 only), `fp32` is the ceiling all the same: every group trains in fp32, and
its predicted_ms is None (no such plan runs on that cluster).

`pace_split` picks the split for a setting by rule rather than by hand: the largest weak
batch (on a grid of global_batch/16) at which the weak group, uniformly at its lowest
offered precision, keeps pace with the strong group by the replayer; so uniform-lowest is
the fastest way to keep pace with that batch, and every other plan must fit in its slack.
"""

from __future__ import annotations

from dataclasses import dataclass

from qsync_opt.training.pipeline import prepare, solve
from qsync_opt.training.predictor.indicators import compute_indicator
from qsync_opt.training.solving import as_baseline
from qsync_opt.training.predictor.instance_builder import baseline, build_instance
from qsync_opt.training.predictor.replayer import replay
from qsync_opt.training.batch_split import candidate_splits
from qsync_opt.training.spec import load_spec

POLICIES = ("fp32", "uniform-lowest", "qsync-greedy", "greedy", "ilp", "batching", "joint")
FROM_BASELINE = {"fp32": "all highest (fp32)", "uniform-lowest": "uniform lowest",
                 "qsync-greedy": "qsync greedy (QSync allocator)", "greedy": "greedy (gain per ms)"}


@dataclass
class Policy:
    name: str
    precisions: dict[str, dict[str, str]] | None
    """group -> FQN -> precision; None when the policy found no plan (infeasible)."""
    local_batches: dict[str, int]
    predicted_ms: float | None
    indicator: float | None
    note: str = ""
    indicator_used: str = ""
    """The planner's indicator, as the plan records it (Plan.indicator_used, the cache path dropped)."""


def cluster_spec(model: dict, strong: str, split: tuple[int, int], weak_precisions, *, global_batch: int,
                 batch_split="fixed", bound=None, extra: dict | None = None, weak_count: int = 1,
                 training: dict | None = None) -> dict:
    """The cluster's job spec; `extra` adds top-level sections (data, indicator) to plan with;
    `weak_count` T4s (one strong device), each at split[1] samples; `training` more training fields
    (optimizer, lr: what indicator auto's fp32 warm-up trains with)."""
    t4 = {"name": "t4", "device": "T4", "role": "inference", "count": weak_count}
    if weak_precisions:
        t4["precisions"] = list(weak_precisions)
    groups = [{"name": "strong", "device": strong, "role": "training"}, t4]
    if batch_split == "fixed":
        groups[0]["local_batch"], groups[1]["local_batch"] = split
    spec = {"name": "accuracy", "cluster": {"groups": groups, "interconnect": "ethernet-100g"}, "model": model,
            "training": {"global_batch": global_batch, "seed": 0, "batch_split": batch_split, **(training or {})},
            "solver": {"backend": "highs", "time_limit_s": 30},
            # The plans are for GPU clusters running QSync's runtime (activations at low precision
            # between same-format ops); training here only reproduces their numerics, which do not
            # depend on where casts happen. accuracy.csv was made this way.
            "runtime": {"boundary": "edge"}}
    if bound is not None:
        spec["objective"] = {"max_iteration_time": bound}
    extra = dict(extra or {})
    spec["training"].update(extra.pop("training", {}))  # a task's own training fields (seq_len) join, not replace
    return {**spec, **extra}


def plan_policies(model: dict, strong: str, split: tuple[int, int], weak_precisions, global_batch: int,
                  extra: dict | None = None, weak_count: int = 1, bound: float | None = None,
                  training: dict | None = None) -> dict[str, Policy]:
    fixed = load_spec(cluster_spec(model, strong, split, weak_precisions, global_batch=global_batch, extra=extra,
                                   weak_count=weak_count, bound=bound, training=training))
    if fixed.indicator.method == "auto" and fixed.data is not None:
        # what `qsync-opt run` / `indicate` do before planning: compute the auto indicator once (cached), so
        # `solve` below reads it instead of falling back to the weight indicator
        compute_indicator(fixed, compute=True)
    plan = solve(fixed)
    used = _indicator_used(plan.indicator_used)
    if fixed.indicator.method == "auto" and fixed.data is not None and "fell back" in plan.indicator_used:
        raise RuntimeError(f"the plan fell back from the auto indicator: {plan.indicator_used}")
    lbs = {n: g.local_batch for n, g in plan.groups.items()}
    ceiling_only = weak_precisions is not None and "fp32" not in weak_precisions
    out = {"ilp": Policy("ilp", {n: dict(g.precisions) for n, g in plan.groups.items()}, lbs, plan.iteration_ms,
                         plan.indicator, f"{plan.solver.backend} {plan.solver.status}", used)}
    for pol, name in FROM_BASELINE.items():
        b = plan.baselines.get(name)
        if pol == "fp32" and ceiling_only:
            out[pol] = Policy(pol, {n: {op: "fp32" for op in g.precisions} for n, g in plan.groups.items()}, lbs,
                              None, 0.0, "ceiling: the weak group offers no fp32, so no plan of this cluster runs it")
            continue
        if b is None:
            out[pol] = Policy(pol, None, lbs, None, None, "the heuristic found no plan within the bounds")
        else:
            out[pol] = Policy(pol, b.precisions, b.local_batches or lbs, b.iteration_ms, b.indicator,
                              "" if b.feasible else "misses a bound", used)
    bound = plan.groups["t4"].time_bound_ms
    auto = load_spec(cluster_spec(model, strong, split, weak_precisions, global_batch=global_batch,
                                  batch_split="auto", bound=bound, extra=extra, weak_count=weak_count,
                                  training=training))
    try:
        joint = solve(auto)
        out["joint"] = Policy("joint", {n: dict(g.precisions) for n, g in joint.groups.items()},
                              {n: g.local_batch for n, g in joint.groups.items()}, joint.iteration_ms, joint.indicator,
                              f"bound {bound:.3f} ms", _indicator_used(joint.indicator_used))
    except Exception as e:  # noqa: BLE001 - an infeasible joint plan is a result, not a crash
        out["joint"] = Policy("joint", None, lbs, None, None, f"{type(e).__name__}: {str(e).splitlines()[0]}")
    out["batching"] = _batching_alone(auto)
    return out


def _indicator_used(note: str) -> str:
    """The plan's indicator note without its cache path (`...; cached /path`)."""
    import re

    return re.sub(r";? ?cached \S+?(?=\)|$)", "", note).replace(" ()", "").strip()


def equal_split(model: dict, strong: str, weak_precisions, global_batch: int, weak_count: int,
                extra: dict | None = None) -> tuple[tuple[int, int], float]:
    """QSync's setting, plain data parallelism: every device the same local batch (the weak share is
    weak devices / all devices), and the bound the uniform-lowest plan's lockstep iteration at that
    split (the T4s at their lowest offered format set the pace; every other plan must fit in it)."""
    per = global_batch // (1 + weak_count)
    return (per, per), lowest_iteration(model, strong, (per, per), weak_precisions, per * (1 + weak_count),
                                        weak_count, extra) * (1 + 1e-9)


def lowest_iteration(model: dict, strong: str, split: tuple[int, int], weak_precisions, global_batch: int,
                     weak_count: int = 1, extra: dict | None = None) -> float:
    """The uniform-lowest plan's lockstep iteration (ms, the replayer's) at `split`: the strong group at
    fp32, the T4s at their lowest offered format."""
    spec = load_spec(cluster_spec(model, strong, split, weak_precisions, global_batch=global_batch,
                                  extra=extra, weak_count=weak_count, bound=1e9))
    prepared = prepare(spec)
    inst, ctx = build_instance(spec, prepared.graph, prepared.sensitivity, boundary=spec.runtime.boundary)
    # role: training keeps the strong group at fp32 under a number, so 'lowest' lowers the T4s alone
    return replay(ctx, baseline(inst, "lowest")).iteration_ms


def pace_split(model: dict, strong: str, weak_precisions, global_batch: int, extra: dict | None = None) -> tuple[int, int]:
    """(strong, weak) local batches: the largest weak batch on a global_batch/16 grid at which the weak
    group at its lowest precision is no slower than the strong group (the replayer's group times)."""
    q = global_batch // 16
    spec = load_spec(cluster_spec(model, strong, (global_batch // 2, global_batch // 2), weak_precisions,
                                  global_batch=global_batch, extra=extra))
    prepared = prepare(spec)
    for weak in range(global_batch - q, 0, -q):
        inst, ctx = build_instance(spec, prepared.graph, prepared.sensitivity,
                                   local_batches={"strong": global_batch - weak, "t4": weak},
                                   boundary=spec.runtime.boundary)
        tl = replay(ctx, baseline(inst, "lowest"))
        if tl.groups["t4"].iteration_ms <= tl.groups["strong"].iteration_ms:
            return global_batch - weak, weak
    raise ValueError(f"{strong} + T4 {weak_precisions}: the T4 keeps pace at no batch >= {q}")


def _batching_alone(spec) -> Policy:
    """Every group at its highest offered precision; the candidate split with the lowest replayed iteration time."""
    prepared = prepare(spec)
    best = None
    for split in candidate_splits(spec):
        inst, ctx = build_instance(spec, prepared.graph, prepared.sensitivity, local_batches=split,
                                   boundary=spec.runtime.boundary)
        b = as_baseline(inst, ctx, baseline(inst, "highest"))
        if best is None or b.iteration_ms < best[1].iteration_ms:
            best = (split, b)
    split, b = best
    return Policy("batching", b.precisions, dict(split), b.iteration_ms, b.indicator, "fastest split at the highest precisions")
